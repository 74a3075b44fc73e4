//! Repro cases end to end, on the real fixtures and the real oracle: `xray check --ops --inject
//! FAULT --dumps D --evidence E`, `xray repro E --out C`, then `xray replay C` with X-Ray's own
//! kernel (faulted: fail; clean: pass) and with given outputs (the case's engine output: fail;
//! its reference output: pass); bad inputs are one line and exit 2; candle's own dump (with its
//! checkpoints written as the points they are) cut into a whole-encoder case; an engine dump
//! without op-level points is refused naming what is missing.

use crate::common;
use common::{RAND, TINY};

use std::path::{Path, PathBuf};

use common::{
    code, compare_with, copy_dir, dump_to, read_json, ready, ready_tempdir, root, s, stderr, xray,
    FOX,
};
use serde_json::Value;
use xray_core::testing::strs;

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// `xray check --model MODEL --audio FOX --dumps DIR/d --evidence DIR/e.json EXTRA..` exiting 1:
/// the evidence path and the evidence.
fn faulty_check(model: &str, dir: &Path, extra: &[&str]) -> (PathBuf, Value) {
    let ev = dir.join("e.json");
    let dumps = dir.join("d");
    let mut args = vec![
        "check",
        "--model",
        model,
        "--audio",
        FOX,
        "--dumps",
        s(&dumps),
        "--evidence",
        s(&ev),
    ];
    args.extend_from_slice(extra);
    let o = xray(&args);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let v = read_json(&ev);
    (ev, v)
}

/// Exit 2 with exactly one line on stderr, `xray: error: ...` containing every `needle`.
fn refused(o: &std::process::Output, needles: &[&str]) {
    let e = stderr(o);
    assert_eq!(code(o), 2, "{e}");
    assert_eq!(e.trim_end().lines().count(), 1, "not one line: {e}");
    assert!(e.starts_with("xray: error: "), "{e}");
    for n in needles {
        assert!(e.contains(n), "{n:?} not in: {e}");
    }
}

/// One line on stdout starting with `xray: replay {verdict}`, with the expected exit code.
fn replayed(o: &std::process::Output, verdict: &str) {
    let out = stdout(o);
    assert_eq!(
        code(o),
        if verdict == "pass" { 0 } else { 1 },
        "{out}{}",
        stderr(o)
    );
    assert_eq!(out.trim_end().lines().count(), 1, "{out}");
    assert!(
        out.starts_with(&format!("xray: replay {verdict}: ")),
        "{out}"
    );
}

/// The case directory `c` cut out of the evidence at `ev` by `xray repro`: its output.
fn repro(ev: &Path, c: &Path) -> std::process::Output {
    let o = xray(&["repro", s(ev), "--out", s(c)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    o
}

/// X-Ray's kernel on case `c`: with `fault` planted it fails, without it passes.
fn runtime_judged(c: &Path, fault: &str) {
    replayed(
        &xray(&["replay", s(c), "--runtime", "--inject", fault]),
        "fail",
    );
    replayed(&xray(&["replay", s(c), "--runtime"]), "pass");
}

/// Case `c`'s given outputs judged: the engine's own fails, the reference passes.
fn given_outputs_judged(c: &Path) {
    for (given, verdict) in [("engine.npy", "fail"), ("reference.npy", "pass")] {
        replayed(
            &xray(&["replay", s(c), "--got", s(&c.join(given))]),
            verdict,
        );
    }
}

/// `xray-candle-op CASE --out OUT` (beside the candle engine `bin`), which must succeed: candle's
/// own kernel on the case's input and weights.
fn candle_op(bin: &Path, c: &Path, out: &Path) {
    let o = std::process::Command::new(bin.with_file_name("xray-candle-op"))
        .args([s(c), "--out", s(out)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn case_json(c: &Path) -> Value {
    read_json(&c.join("case.json"))
}

/// A norm op: encoder layer 1's MLP LayerNorm with epsilon 1e-1 (`layernorm_eps`). The case holds
/// the norm's reference input, its two weights and nothing else; X-Ray's kernel replayed with the
/// fault fails and without it passes; the case's own engine output fails and its reference passes.
#[test]
fn layer_norm_case_reproduces_the_fault_and_replays() {
    let Some(tmp) = ready_tempdir(&[RAND, FOX, ".venv"]) else {
        return;
    };
    let (ev, e) = faulty_check(RAND, tmp.path(), &["--ops", "--inject", "layernorm_eps"]);
    let op = &e["first_divergence"]["op"];
    assert_eq!(op["op"], "encoder.layer.1.mlp_norm", "{op:#}");
    assert!(e["run"]["dumps"]["reference"].is_string(), "{:#}", e["run"]);
    common::assert_schema_valid(&e);

    let c = tmp.path().join("case");
    let o = repro(&ev, &c);
    assert_eq!(stderr(&o).trim_end().lines().count(), 1, "{}", stderr(&o));
    let j = case_json(&c);
    assert_eq!(j["schema"], "xray.case/v1");
    assert_eq!(j["op"]["name"], "encoder.layer.1.mlp_norm");
    assert_eq!(j["op"]["kind"], "layer_norm");
    assert_eq!(j["point"], "model.encoder.layers.1.final_layer_norm:out");
    let m = "model.encoder.layers.1.final_layer_norm";
    assert_eq!(j["upstream"]["module"], m);
    assert_eq!(j["upstream"]["class"], "nn.LayerNorm");
    assert_eq!(
        j["upstream"]["file"],
        "transformers/models/whisper/modeling_whisper.py"
    );
    assert!(j["upstream"]["known_from"].as_array().unwrap().len() >= 3);
    assert_eq!(j["inputs"][0]["point"], format!("{m}:in"));
    assert_eq!(j["engine"]["passes"], false);
    assert_eq!(j["tolerance"], op["tolerance"]);
    // Only the weights the op reads, named by their safetensors keys.
    let keys: Vec<&str> = strs(&j["weights"], "key");
    assert_eq!(keys, [format!("{m}.weight"), format!("{m}.bias")]);
    let mut on_disk: Vec<String> = std::fs::read_dir(c.join("weights"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    on_disk.sort();
    assert_eq!(
        on_disk,
        [format!("{m}.bias.npy"), format!("{m}.weight.npy")]
    );

    // X-Ray's kernel on the case: with the fault it fails, without it passes.
    runtime_judged(&c, "layernorm_eps");
    // Given outputs: the engine's own fails, the reference passes.
    given_outputs_judged(&c);
    // A fault that plants on another op does not change this one: refused, not a silent pass.
    refused(
        &xray(&["replay", s(&c), "--runtime", "--inject", "gelu_tanh"]),
        &["does not change op encoder.layer.1.mlp_norm"],
    );

    // The case exists: refused without --force, replaced with it.
    refused(
        &xray(&["repro", s(&ev), "--out", s(&c)]),
        &["already holds an X-Ray case", "--force"],
    );
    let o = xray(&["repro", s(&ev), "--out", s(&c), "--force"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));

    // Bad inputs: one line, exit 2.
    let broken = tmp.path().join("broken");
    copy_dir(&c, &broken);
    std::fs::remove_file(broken.join(format!("weights/{m}.bias.npy"))).unwrap();
    refused(
        &xray(&["replay", s(&broken), "--runtime"]),
        &[&format!("{m}.bias.npy"), "missing"],
    );
    let wrong = tmp.path().join("wrong-schema");
    copy_dir(&c, &wrong);
    let text = std::fs::read_to_string(wrong.join("case.json"))
        .unwrap()
        .replace("xray.case/v1", "xray.case/v9");
    std::fs::write(wrong.join("case.json"), text).unwrap();
    refused(
        &xray(&["replay", s(&wrong), "--got", s(&c.join("reference.npy"))]),
        &["xray.case/v9", "xray.case/v1"],
    );
    // A --got of the wrong shape (a weight of the case).
    refused(
        &xray(&[
            "replay",
            s(&c),
            "--got",
            s(&c.join(format!("weights/{m}.weight.npy"))),
        ]),
        &["shape [64]", "final_layer_norm:out is [250, 64]"],
    );
    refused(
        &xray(&["replay", s(&c), "--got", s(&tmp.path().join("nope.npy"))]),
        &["nope.npy"],
    );
    // An output directory that exists and is not X-Ray's.
    let mine = tmp.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("notes.txt"), "keep me").unwrap();
    refused(
        &xray(&["repro", s(&ev), "--out", s(&mine), "--force"]),
        &["not an X-Ray case"],
    );
    assert_eq!(
        std::fs::read_to_string(mine.join("notes.txt")).unwrap(),
        "keep me"
    );
    // Evidence without an op-level origin, and without dumps.
    let mut no_op = e.clone();
    no_op["first_divergence"]
        .as_object_mut()
        .unwrap()
        .remove("op");
    let p = tmp.path().join("no-op.json");
    std::fs::write(&p, no_op.to_string()).unwrap();
    refused(
        &xray(&["repro", s(&p), "--out", s(&tmp.path().join("c2"))]),
        &["no op-level origin"],
    );
    let mut no_dumps = e.clone();
    no_dumps["run"].as_object_mut().unwrap().remove("dumps");
    let p = tmp.path().join("no-dumps.json");
    std::fs::write(&p, no_dumps.to_string()).unwrap();
    refused(
        &xray(&["repro", s(&p), "--out", s(&tmp.path().join("c3"))]),
        &["names no dumps", "--reference"],
    );
    assert!(!tmp.path().join("c2").exists() && !tmp.path().join("c3").exists());
}

/// A linear op: encoder layer 1's attention output projection with its weight rounded to int8
/// (`out_proj_int8`). Its input is the merged heads (`out_proj:in`), its weights the
/// projection's; X-Ray's kernel with the fault fails, without it passes.
#[test]
fn linear_case_reproduces_the_fault_and_replays() {
    let Some(tmp) = ready_tempdir(&[RAND, FOX, ".venv"]) else {
        return;
    };
    let (ev, e) = faulty_check(RAND, tmp.path(), &["--ops", "--inject", "out_proj_int8"]);
    assert_eq!(
        e["first_divergence"]["op"]["op"], "encoder.layer.1.out_proj",
        "{:#}",
        e["first_divergence"]
    );
    let c = tmp.path().join("case");
    repro(&ev, &c);
    let j = case_json(&c);
    let m = "model.encoder.layers.1.self_attn.out_proj";
    assert_eq!(j["op"]["kind"], "linear");
    assert_eq!(j["upstream"]["class"], "nn.Linear");
    assert_eq!(j["upstream"]["module"], m);
    assert_eq!(j["inputs"][0]["point"], format!("{m}:in"));
    assert_eq!(j["divergence"]["signature"], "grid_quantization");
    runtime_judged(&c, "out_proj_int8");
    given_outputs_judged(&c);
}

/// Dumps made without `--ops` hold no op-level points (the drill-down captured its points in
/// memory only): `xray repro` refuses, naming the point it needs and the flag that makes it.
#[test]
fn dumps_without_points_are_refused_naming_the_point() {
    let Some(tmp) = ready_tempdir(&[RAND, FOX, ".venv"]) else {
        return;
    };
    let (ev, e) = faulty_check(RAND, tmp.path(), &["--inject", "layernorm_eps"]);
    assert_eq!(
        e["first_divergence"]["op"]["op"],
        "encoder.layer.1.mlp_norm"
    );
    refused(
        &xray(&["repro", s(&ev), "--out", s(&tmp.path().join("c"))]),
        &["model.encoder.layers.1.final_layer_norm:in@step0", "--ops"],
    );
}

/// `xray-candle-whisper ARGS..` (from the repository root); exit 0 or the test fails.
fn candle(bin: &Path, args: &[&str]) {
    let o = std::process::Command::new(bin)
        .current_dir(root())
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The candle binaries beside `xray` (`cargo build --release -p xray-candle-whisper`), or a
/// recorded skip.
fn candle_bin() -> Option<PathBuf> {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_xray")).with_file_name("xray-candle-whisper");
    let op = bin.with_file_name("xray-candle-op");
    xray_core::testing::require_all(
        &[&bin, &op],
        "`cargo build --release -p xray-candle-whisper`",
    )
    .then_some(bin)
}

/// For a candle test on tiny.en and fox.wav (guarded by [`ready`], then [`candle_bin`]): the
/// candle binary and a temporary directory.
fn candle_ready() -> Option<(PathBuf, tempfile::TempDir)> {
    if !ready(&[TINY, FOX, ".venv"]) {
        return None;
    }
    let bin = candle_bin()?;
    Some((bin, tempfile::tempdir().unwrap()))
}

/// candle's own dump, cut into a case: candle (engines/candle-whisper) with `--ops` writes each
/// checkpoint also under the op-level points the contract declares it is, so fed the reference's
/// log-mel its encoder's input (`model.encoder.conv1:in`, `model.encoder:in`) agrees and its output
/// (`model.encoder.layer_norm:out`, `model.encoder:out`) does not: `xray compare --model` names
/// the whole `model.encoder` (the only module both of whose boundaries candle's API exposes),
/// replay convicts it (candle's real error: tanh GELU, recomputed positions), `xray repro` cuts
/// it out, and the case judges: candle's output fails, the reference passes, X-Ray's own ops pass
/// clean and fail with a GELU fault planted inside the module, and candle's encoder run alone on
/// the case (`xray-candle-op`) fails as candle's dump did.
#[test]
fn candle_encoder_case_from_its_own_dump() {
    let Some((bin, tmp)) = candle_ready() else {
        return;
    };
    let reference = tmp.path().join("ref");
    let o = dump_to("oracle", TINY, FOX, &reference, &["--ops"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let enc = tmp.path().join("enc");
    candle(
        &bin,
        &[
            "--model",
            TINY,
            "--audio",
            FOX,
            "--ops",
            "--mel-from",
            s(&reference),
            "--out",
            s(&enc),
        ],
    );
    let ev = tmp.path().join("e.json");
    let e = common::compare_dumps(&reference, &enc, TINY, &ev, 1);
    common::assert_schema_valid(&e);
    let op = &e["first_divergence"]["op"];
    assert_eq!(op["module"], "model.encoder", "{op:#}");
    assert_eq!(op["boundary"], true, "{op:#}");
    assert_eq!(op["point"], "model.encoder.layer_norm:out");
    assert_eq!(op["inputs"][0]["point"], "model.encoder.conv1:in");
    assert_eq!(op["inputs"][0]["status"], "pass");
    let suspects = op["suspects"].as_array().unwrap();
    assert!(
        suspects.iter().any(|o| o == "encoder.layer.1.gelu"),
        "{op:#}"
    );
    assert_eq!(suspects.first().unwrap(), "encoder.conv1");
    assert_eq!(suspects.last().unwrap(), "encoder.final_norm");
    let local = &op["replay"]["local_error"];
    assert_eq!(local["verdict"], "convicted", "{op:#}");
    let tol = op["tolerance"]["max_rel_l2"].as_f64().unwrap();
    assert!(local["rel_l2"].as_f64().unwrap() > tol, "{local:#}");
    assert!(
        op["replay"]["replay_floor"].as_f64().unwrap() < tol,
        "{op:#}"
    );

    let c = tmp.path().join("case");
    repro(&ev, &c);
    eprintln!("{}", stderr(&o));
    let j = case_json(&c);
    assert_eq!(j["op"]["name"], "model.encoder");
    assert_eq!(j["op"]["kind"], "module");
    assert_eq!(j["op"]["params"]["ops"].as_array().unwrap(), suspects);
    assert_eq!(j["upstream"]["class"], "WhisperEncoder");
    assert_eq!(j["inputs"][0]["point"], "model.encoder.conv1:in");
    assert_eq!(j["point"], "model.encoder.layer_norm:out");
    assert_eq!(j["engine"]["producer"], "candle");
    assert_eq!(j["engine"]["passes"], false);
    assert_eq!(j["config"]["model_type"], "whisper");
    let keys: Vec<&str> = strs(&j["weights"], "key");
    assert!(
        keys.iter().all(|k| k.starts_with("model.encoder.")),
        "{keys:?}"
    );
    assert!(
        keys.contains(&"model.encoder.layers.3.fc2.weight"),
        "{keys:?}"
    );

    // Given outputs: candle's own fails, the reference passes.
    given_outputs_judged(&c);
    // X-Ray's own ops for the module: clean they pass, with a fault inside it they fail.
    let o = xray(&["replay", s(&c), "--runtime"]);
    eprintln!("{}", stdout(&o));
    replayed(&o, "pass");
    let o = xray(&["replay", s(&c), "--runtime", "--inject", "gelu_tanh"]);
    eprintln!("{}", stdout(&o));
    replayed(&o, "fail");
    // A fault outside the module does not change it: refused, not a silent pass.
    refused(
        &xray(&[
            "replay",
            s(&c),
            "--runtime",
            "--inject",
            "causal_mask_dropped",
        ]),
        &["does not change op model.encoder"],
    );
    // candle's encoder alone on the case: what candle's dump held.
    let out = tmp.path().join("candle-enc.npy");
    candle_op(&bin, &c, &out);
    let o = xray(&["replay", s(&c), "--got", s(&out), "--json"]);
    assert_eq!(code(&o), 1, "{}{}", stdout(&o), stderr(&o));
    let got: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let (alone, dumped) = (
        got["metrics"]["rel_l2"].as_f64().unwrap(),
        j["engine"]["metrics"]["rel_l2"].as_f64().unwrap(),
    );
    // The same computation on the same input; candle's CPU matmuls are not bit-reproducible
    // from run to run (measured: rel_l2 2.4556e-3 and 2.4553e-3 on two runs), so within 1%.
    assert!(
        (alone - dumped).abs() <= 1e-2 * dumped,
        "{alone} vs {dumped}"
    );
    eprintln!("candle's encoder alone on the case: rel_l2 {alone:.3e} (its dump: {dumped:.3e})");
}

/// A candle dump without op-level points (made without `--ops`, as an engine that exposes none
/// writes it): an evidence comparing it has no op-level origin to cut out, and its dump given as
/// the engine side of a case is refused naming the point it lacks. A case cut from X-Ray's
/// runtime on the same model still tests candle's kernel for the op (`xray-candle-op`: candle's
/// LayerNorm on the case's input and weights, judged by `xray replay --got`).
#[test]
fn candle_dump_without_points_is_refused_naming_what_is_missing() {
    let Some((bin, tmp)) = candle_ready() else {
        return;
    };
    let candle_dump = tmp.path().join("candle");
    candle(
        &bin,
        &["--model", TINY, "--audio", FOX, "--out", s(&candle_dump)],
    );
    // The runtime on tiny.en with a fault, every point captured: an evidence with an op.
    let (ev, e) = faulty_check(TINY, tmp.path(), &["--ops", "--inject", "layernorm_eps"]);
    assert_eq!(
        e["first_divergence"]["op"]["op"],
        "encoder.layer.1.mlp_norm"
    );
    refused(
        &xray(&[
            "repro",
            s(&ev),
            "--got",
            s(&candle_dump),
            "--out",
            s(&tmp.path().join("c")),
        ]),
        &[
            "model.encoder.layers.1.final_layer_norm:out@step0",
            "holds no op-level point",
            "--ops",
        ],
    );
    // The case cut from X-Ray's runtime is a unit test for candle's kernel of the same op:
    // candle_nn::LayerNorm on the case's input and weights meets the reference.
    let c = tmp.path().join("case");
    repro(&ev, &c);
    let out = tmp.path().join("candle-op.npy");
    candle_op(&bin, &c, &out);
    let o = xray(&["replay", s(&c), "--got", s(&out)]);
    eprintln!("{}", stdout(&o));
    replayed(&o, "pass");
    // Candle without points against the reference: whatever the verdict, no op-level origin.
    let reference = tmp.path().join("d/reference");
    let ev2 = tmp.path().join("candle.json");
    let o = compare_with(
        &reference,
        &candle_dump,
        &["--model", TINY, "--evidence", s(&ev2)],
    );
    assert!(code(&o) <= 1, "{}", stderr(&o));
    refused(
        &xray(&["repro", s(&ev2), "--out", s(&tmp.path().join("c2"))]),
        &["no op-level origin"],
    );
}
