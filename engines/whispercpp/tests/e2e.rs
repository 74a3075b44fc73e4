//! whisper.cpp under X-Ray, end to end on the real tiny.en (converted to ggml f32 and f16 by
//! fixtures/make_ggml.py) and fox.wav: `xray oracle --ops` (the HF reference), this engine plain,
//! with flash attention and fed the reference's log-mel and tokens, `xray compare --model` on
//! each, and the findings asserted as measured (docs/engines/whispercpp.md, "X-Ray on
//! whisper.cpp").
//!
//! The `xray` binary is the one `cargo test --workspace` / `make test` builds next to this test;
//! the ggml files come from `make whispercpp-models`; the oracle needs the project venv.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;
use xray_core::dump::Dump;
use xray_core::testing::{
    evidence_checkpoint as checkpoint, repo as root, run_in_repo as run, stderr, strs, xray_bin,
    xray_compare, xray_oracle,
};

const MODEL: &str = "fixtures/whisper-tiny-en";
const FOX: &str = "fixtures/audio/fox.wav";
const F32: &str = "fixtures/build/ggml/tiny-en-f32.bin";
const F16: &str = "fixtures/build/ggml/tiny-en-f16.bin";
/// Tolerances at f16 level: the precision whisper.cpp declares for its ops
/// (docs/engines/whispercpp.md, "X-Ray on whisper.cpp").
const F16_POLICY: &str = "engines/whispercpp/policies/f16-accepted.json";

/// The reference dump of fox.wav with every op-level point, made once for the tests of this file.
fn reference() -> &'static Path {
    static REF: OnceLock<PathBuf> = OnceLock::new();
    REF.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        let r = dir.join("ref");
        xray_oracle(MODEL, FOX, &r, &["--ops"]);
        r
    })
}

fn ready() -> bool {
    let need = [
        root().join(MODEL),
        root().join(FOX),
        root().join(F32),
        root().join(F16),
        root().join(".venv/bin/python"),
        xray_bin(),
    ];
    xray_core::testing::require_all(
        &need,
        "run `make whispercpp-models`; `cargo test` builds xray",
    )
}

fn engine(ggml: &str, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "--model",
        MODEL,
        "--ggml",
        ggml,
        "--audio",
        FOX,
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run(Path::new(env!("CARGO_BIN_EXE_xray-whispercpp")), &args)
}

/// `xray compare REF GOT --model MODEL ARGS..` (the op-level drill-down and replay along the
/// model): the evidence.
fn compare(reference: &Path, got: &Path, dir: &Path, tag: &str, args: &[&str]) -> Value {
    xray_compare(
        reference,
        got,
        dir,
        tag,
        &[&["--model", MODEL], args].concat(),
    )
}

fn rel_l2(c: &Value) -> f64 {
    c["metrics"]["rel_l2"]
        .as_f64()
        .unwrap_or_else(|| panic!("{}: no rel_l2", c["name"]))
}

#[test]
fn whisper_cpp_under_xray_on_real_tiny_en() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The reference every test of this file shares (its op-level points captured).
    let reference = reference().to_path_buf();
    let r = reference.to_str().unwrap();
    let ref_dump = Dump::load(&reference).unwrap();

    // 1. whisper.cpp 1.8.3 cannot run an f32 model: its conv's f16 IM2COL asserts an f16
    // kernel. The engine refuses the graph (naming the node) before the process would abort.
    let refused = dir.path().join("refused");
    let o = engine(F32, &refused, &["--no-neutrality"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("node_0 (IM2COL f16") && e.contains("ggml_compute_forward_im2col_f16"),
        "{e}"
    );
    assert!(!refused.exists());

    // 2. The f32 model with the IM2COL stand-in kernel, every op-level point captured.
    let f32 = dir.path().join("f32");
    let o = engine(F32, &f32, &["--im2col-stub", "--ops"]);
    assert!(o.status.success(), "engine f32: {}", stderr(&o));
    let d = Dump::load(&f32).unwrap();
    let m = &d.manifest;
    assert_eq!(m.producer, "whisper.cpp");
    assert_eq!(m.tools["whisper.cpp"], "1.8.3");
    assert_eq!(m.weights_sha256, ref_dump.manifest.weights_sha256);
    assert_eq!(m.extra["ggml_model"]["ftype"], "f32");
    assert_eq!(m.extra["ggml_model"]["mel_filters"]["source"], "openai");
    assert_eq!(m.extra["capture_neutral"]["equal"], true);
    assert_eq!(m.extra["ggml"]["graph_edits"][0]["nodes"], 2);
    // The ops computed below f32 although every weight is f32, each with its ggml source.
    let reduced: Vec<&str> = strs(&m.extra["precision"], "op");
    for op in [
        "encoder.conv1",
        "encoder.conv1_gelu",
        "encoder.layer.0.self_attn",
        "encoder.layer.0.gelu",
        "decoder.layer.0.cross_k_to_head_major",
        "decoder.layer.3.self_v_append",
    ] {
        assert!(reduced.contains(&op), "{op} not in {reduced:?}");
    }
    assert!(
        !reduced.contains(&"encoder.layer.0.fc1"),
        "f32 x f32 MUL_MAT is f32"
    );
    assert_eq!(
        m.extra["ggml"]["types"]["audio.encoder.conv1.out@0"]["type"],
        "f32"
    );
    // Every contract checkpoint is observed (292 on fox, as the reference).
    let e = compare(&reference, &f32, dir.path(), "f32", &[]);
    assert_eq!(e["verdict"], "diverged");
    assert_eq!(e["coverage"]["observed"], 292);
    assert_eq!(e["transcript"]["tokens_equal"], true);
    // whisper.cpp's log-mel (with openai-whisper's filter bank) and conv1 are HF's within f32
    // tolerance; the first departure is its GELU after conv1 (tanh form through an f16 table),
    // seen at conv2.out and localized to the op by the op-level points.
    assert_eq!(checkpoint(&e, "audio.frontend.mel", 0)["status"], "pass");
    assert!(rel_l2(checkpoint(&e, "audio.frontend.mel", 0)) < 1e-5);
    assert_eq!(
        checkpoint(&e, "audio.encoder.conv1.out", 0)["status"],
        "pass"
    );
    let fd = &e["first_divergence"];
    assert_eq!(fd["checkpoint"], "audio.encoder.conv2.out");
    assert_eq!(fd["op"]["op"], "encoder.conv1_gelu");
    assert_eq!(fd["op"]["point"], "model.encoder.conv2:in");
    let mem = rel_l2(checkpoint(&e, "audio.encoder.memory", 0));
    assert!((1e-3..5e-3).contains(&mem), "memory rel_l2 {mem}");
    // The comparison names the ops the dump declares computed below f32; nothing accepted.
    let declared: Vec<&str> = strs(&e["precision"]["declared"], "op");
    assert_eq!(declared, reduced);
    assert_eq!(e["precision"]["accepted"], serde_json::json!([]));
    // Told to accept the declared f16, the f32 model passes every checkpoint; and every module
    // re-run on whisper.cpp's own input (`--local-errors`) convicts no op declared f32.
    let e = compare(
        &reference,
        &f32,
        dir.path(),
        "f32-policy",
        &["--policy", F16_POLICY, "--local-errors"],
    );
    assert_eq!(e["verdict"], "pass", "{}", e["first_divergence"]);
    assert!(e["local_errors"]["replayed"].as_u64().unwrap() > 500);
    // Per op, not a blanket bound: what a declared op reaches is judged at the accepted bounds,
    // naming the first declared op upstream; what none reaches (the log-mel, the token ids)
    // keeps f32's.
    assert_eq!(e["precision"]["accepted"], serde_json::json!(["f16"]));
    let source = |n: &str| {
        checkpoint(&e, n, 0)["tolerance"]["source"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(source("audio.frontend.mel"), "default:f32");
    assert_eq!(source("audio.decoder.input_ids"), "default:f32");
    for n in [
        "audio.encoder.conv1.out",
        "audio.encoder.layer.0.out",
        "audio.decoder.layer.3.out",
    ] {
        assert_eq!(source(n), "precision:f16 via encoder.conv1", "{n}");
    }

    // 3. The f16 model fed the reference's log-mel and tokens: the decoder's own error keeps
    // every argmax.
    let fed = dir.path().join("f16-fed");
    let o = engine(
        F16,
        &fed,
        &["--mel-from", r, "--tokens-from", r, "--no-neutrality"],
    );
    assert!(o.status.success(), "engine fed: {}", stderr(&o));
    let e = compare(&reference, &fed, dir.path(), "f16-fed", &[]);
    assert_eq!(e["tokens"]["teacher_forced"], true);
    let fed_list: Vec<&str> = strs(&e["fed"], "checkpoint");
    assert_eq!(fed_list, ["audio.frontend.mel", "tokens"]);
    for c in e["checkpoints"].as_array().unwrap() {
        if c["name"] == "audio.decoder.logits" {
            assert_eq!(
                c["metrics"]["logits"]["argmax_agreement"], 1.0,
                "{}",
                c["step"]
            );
            assert!(
                rel_l2(c) < 0.02,
                "logits rel_l2 {} at {}",
                rel_l2(c),
                c["step"]
            );
        }
    }

    // 4. Flash attention: the encoder's memory departs 30x further (ggml's CPU flash attention
    // accumulates V in f16, and whisper.cpp attends to the 36 zero rows that pad its K/V to 1536
    // without a mask); the tokens are still the reference's on fox.
    let flash = dir.path().join("f16-flash");
    let o = engine(F16, &flash, &["--flash-attn", "--no-neutrality"]);
    assert!(o.status.success(), "engine flash: {}", stderr(&o));
    let e = compare(&reference, &flash, dir.path(), "f16-flash", &[]);
    let fmem = rel_l2(checkpoint(&e, "audio.encoder.memory", 0));
    assert!(
        fmem > 10.0 * mem && fmem < 0.2,
        "flash memory rel_l2 {fmem}"
    );
    assert_eq!(e["transcript"]["tokens_equal"], true);
    // No probabilities exist with flash attention: those checkpoints are unobserved.
    assert_eq!(
        checkpoint(&e, "audio.decoder.layer.0.self_attention.probs", 0)["status"],
        "unobserved"
    );
}

/// The f32 ggml file converted with `plant` (fixtures/make_ggml.py --plant), run on fox with
/// every op-level point, and compared under the f16 policy (and `extra` arguments): the evidence.
fn planted(dir: &Path, plant: &str) -> Value {
    planted_with(dir, plant, &[])
}

fn planted_with(dir: &Path, plant: &str, extra: &[&str]) -> Value {
    planted_as(dir, plant, "f32", extra)
}

/// [`planted_with`] converting to `ftype` (`f32`, `f16`); the files are `dir/{kind}.bin` (f32) or
/// `dir/{kind}-{ftype}.bin`.
fn planted_as(dir: &Path, plant: &str, ftype: &str, extra: &[&str]) -> Value {
    let kind = plant.split('=').next().unwrap();
    let tag = match ftype {
        "f32" => kind.to_string(),
        _ => format!("{kind}-{ftype}"),
    };
    let tag = tag.as_str();
    let ggml = dir.join(format!("{tag}.bin"));
    let o = Command::new(root().join(".venv/bin/python"))
        .current_dir(root())
        .args([
            "fixtures/make_ggml.py",
            "--model",
            MODEL,
            "--ftype",
            ftype,
            "--out",
        ])
        .arg(&ggml)
        .args(["--plant", plant])
        .output()
        .unwrap();
    assert!(o.status.success(), "converter: {}", stderr(&o));
    let got = dir.join(tag);
    let o = engine(
        ggml.to_str().unwrap(),
        &got,
        // A broken decoder runs on to max_length: the reference's 12 tokens are enough.
        &[
            "--im2col-stub",
            "--ops",
            "--no-neutrality",
            "--max-new-tokens",
            "12",
        ],
    );
    assert!(o.status.success(), "engine {tag}: {}", stderr(&o));
    let d = Dump::load(&got).unwrap();
    assert_eq!(d.manifest.extra["ggml_model"]["planted"][0]["kind"], kind);
    compare(
        reference(),
        &got,
        dir,
        tag,
        &[&["--policy", F16_POLICY], extra].concat(),
    )
}

/// The ggml file `dir/{tag}.bin` read back under HF names (fixtures/ggml_to_hf.py) and compared
/// with the HF weights (`xray weights`): the keys that differ, with their signatures.
fn weights_differ(dir: &Path, tag: &str) -> Vec<(String, String)> {
    let hf = dir.join(format!("{tag}.safetensors"));
    let o = Command::new(root().join(".venv/bin/python"))
        .current_dir(root())
        .args(["fixtures/ggml_to_hf.py", "--model", MODEL, "--ggml"])
        .arg(dir.join(format!("{tag}.bin")))
        .arg("--out")
        .arg(&hf)
        .output()
        .unwrap();
    assert!(o.status.success(), "ggml_to_hf: {}", stderr(&o));
    let json = dir.join(format!("{tag}.weights.json"));
    let o = run(
        &xray_bin(),
        &[
            "weights",
            MODEL,
            hf.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    v["differs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["key"].as_str().unwrap().to_string(),
                d["signature"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Converter bugs planted in the f32 ggml file (fixtures/make_ggml.py --plant) are found at the
/// op they corrupt, with the mechanism, once f16-level error is accepted (without the policy the
/// first departure is whisper.cpp's own f16 conv/GELU and every later op is `propagated`). Read
/// back from the file (`xray weights`), each is the one tensor that differs, with its signature.
#[test]
fn planted_converter_bugs_are_found_at_the_op_with_a_mechanism() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (plant, origin, op, mechanism, weights) in [
        (
            "wrong_layer=encoder.blocks.1.mlp.0.weight",
            "audio.encoder.layer.1.out",
            "encoder.layer.1.fc1",
            serde_json::json!({"kind": "other_key", "role": "weight", "key": "model.encoder.layers.2.fc1.weight"}),
            ("model.encoder.layers.1.fc1.weight", "wiring"),
        ),
        (
            "transpose=encoder.blocks.2.attn.out.weight",
            "audio.encoder.layer.2.out",
            "encoder.layer.2.out_proj",
            serde_json::json!({"kind": "transpose_weight"}),
            (
                "model.encoder.layers.2.self_attn.out_proj.weight",
                "permutation",
            ),
        ),
        (
            "drop_bias=decoder.blocks.0.mlp.2.bias",
            "audio.decoder.layer.0.out",
            "decoder.layer.0.fc2",
            serde_json::json!({"kind": "bias_missing"}),
            ("model.decoder.layers.0.fc2.bias", "scale"),
        ),
        // The first checkpoint the positions reach is the first layer's attention; the lookup is
        // found by the embedding's op-level points.
        (
            "shift_rows=decoder.positional_embedding",
            "audio.decoder.layer.0.self_attention.probs",
            "decoder.embed_positions",
            serde_json::json!({"kind": "id_offset", "by": 1}),
            ("model.decoder.embed_positions.weight", "shift"),
        ),
    ] {
        let tag = plant.split('=').next().unwrap();
        let e = planted(dir.path(), plant);
        let fd = &e["first_divergence"];
        assert_eq!(fd["checkpoint"], origin, "{tag}: {fd}");
        assert_eq!(fd["op"]["op"], op, "{tag}: {fd}");
        let replay = &fd["op"]["replay"];
        assert_eq!(replay["local_error"]["verdict"], "convicted", "{tag}");
        assert_eq!(
            replay["mechanism"]["counterfactual"], mechanism,
            "{tag}: {replay}"
        );
        let (key, signature) = weights;
        assert_eq!(
            weights_differ(dir.path(), tag),
            [(key.to_string(), signature.to_string())],
            "{tag}"
        );
    }
}

/// A filter bank converted without Slaney's area normalization (every filter at peak 1): the
/// log-mel departs at whisper.cpp's own frontend, and the difference is one offset per mel bin
/// above the floors (log10 of each filter's gain, over 4), which is what X-Ray says.
#[test]
fn an_unnormalized_filter_bank_is_one_offset_per_mel_bin() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let e = planted(dir.path(), "unnormalized=filters");
    let fd = &e["first_divergence"];
    assert_eq!(fd["checkpoint"], "audio.frontend.mel", "{fd}");
    assert_eq!(fd["op"]["op"], "frontend.log_mel", "{fd}");
    let x = &fd["explanation"];
    assert_eq!(x["signature"], "channel_offset", "{x}");
    assert_eq!(x["evidence"]["axis_name"], "mel_bins", "{x}");
    assert_eq!(x["evidence"]["slices"], 80, "{x}");
    // Every filter got louder: 10^(4 o) = 1/area > 1 for each bin.
    let lo = x["evidence"]["range"][0].as_f64().unwrap();
    assert!(lo > 0.0, "{x}");
}

/// One weight rounded to bf16 by the converter (an f32 file): under the f16 policy every
/// checkpoint passes, since its error is below what the declared f16 ops upstream make; the local
/// errors (every module re-run on whisper.cpp's own input) convict that op alone, the one the
/// engine declares f32, and name the rounding. (The clean file: the first test.)
#[test]
fn a_weight_rounded_to_bf16_is_a_local_error_no_policy_hides() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A truncating converter too, on a decoder weight: convicted at its steps and named.
    for (plant, op, format) in [
        (
            "bf16=encoder.blocks.2.mlp.0.weight",
            "encoder.layer.2.fc1",
            "bf16",
        ),
        (
            "bf16_truncated=decoder.blocks.1.mlp.2.weight",
            "decoder.layer.1.fc2",
            "bf16_truncated",
        ),
    ] {
        let e = planted_with(dir.path(), plant, &["--local-errors"]);
        let cks = e["checkpoints"].as_array().unwrap();
        assert!(cks.iter().all(|c| c["status"] == "pass"), "{plant}");
        assert_eq!(e["verdict"], "diverged");
        let l = &e["local_errors"];
        let undeclared: Vec<&Value> = l["convicted"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c.get("declared").is_none())
            .collect();
        assert!(!undeclared.is_empty(), "{plant}: {l}");
        assert!(undeclared.iter().all(|c| c["op"] == op), "{plant}: {l}");
        assert!(
            undeclared.iter().any(|c| c["mechanism"]["counterfactual"]
                == serde_json::json!({"kind": "weight_rounded", "format": format})),
            "{plant}: {l}"
        );
    }
}

/// Precision told from logic inside the ops whisper.cpp declares f16. The local errors replay
/// each declared op the way its declaration says it computes (weight and input rounded to f16,
/// accumulated in f32): on the clean f16 file that reproduces every op convicted at f32 bounds
/// (the run passes). An f16 file whose fc1 weight went through bf16 first (a coarser rounding
/// than declared, in an op declared f16) passes every checkpoint under the f16 policy, but its
/// declared precision does not account for that op: convicted, and the verdict diverges.
#[test]
fn a_declared_f16_op_is_convicted_when_f16_does_not_account_for_it() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let got = dir.path().join("clean-f16");
    let o = engine(F16, &got, &["--im2col-stub", "--ops", "--no-neutrality"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let args = ["--policy", F16_POLICY, "--local-errors"];
    let e = compare(reference(), &got, dir.path(), "clean-f16", &args);
    assert_eq!(e["verdict"], "pass", "{}", e["local_errors"]);
    let convicted = e["local_errors"]["convicted"].as_array().unwrap();
    assert!(convicted.len() > 100, "{}", e["local_errors"]);
    for c in convicted {
        assert_eq!(c["declared"], "f16", "{c}");
        let p = &c["precision"];
        assert_eq!(
            p["counterfactual"],
            serde_json::json!({"kind": "computed_in", "format": "f16"}),
            "{c}"
        );
        assert_eq!(p["accounts"], true, "{c}");
        // The declared computation reproduces the op a hundred times closer than f32 does.
        assert!(
            p["residual"].as_f64().unwrap() < 0.01 * c["rel_l2"].as_f64().unwrap(),
            "{c}"
        );
    }
    let e = planted_as(
        dir.path(),
        "bf16=encoder.blocks.2.mlp.0.weight",
        "f16",
        &["--local-errors"],
    );
    let cks = e["checkpoints"].as_array().unwrap();
    assert!(cks.iter().all(|c| c["status"] == "pass"));
    assert_eq!(e["verdict"], "diverged", "{}", e["local_errors"]);
    let l = &e["local_errors"];
    let beyond: Vec<&Value> = l["convicted"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["precision"]["accounts"] == false)
        .collect();
    assert!(!beyond.is_empty(), "{l}");
    for c in &beyond {
        assert_eq!(c["op"], "encoder.layer.2.fc1", "{c}");
        assert_eq!(c["declared"], "f16", "{c}");
    }
    assert!(
        l["convicted"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c.get("declared").is_some()),
        "{l}"
    );
}
