//! `xray compare` on dumps that cover part of the contract (an outside engine's): `unobserved`,
//! coverage, shape divergences as origin, token alignment, fed edges, and the refusals (nothing
//! observed, a checkpoint the reference lacks, an unknown fed edge). The dumps under test are
//! made from the committed reference dump (real oracle tensors) with the core crate's writer.

use crate::common;

use std::path::{Path, PathBuf};

use common::{code, dump_to, root, stderr, xray};
use serde_json::{json, Value};
use xray_core::dump::Dump;

fn reference() -> PathBuf {
    root().join("fixtures/dumps/whisper-rand-a.fox")
}

/// Writes a copy of the reference dump, changed by `f`, to `dir/name`.
fn variant(dir: &Path, name: &str, f: impl FnOnce(&mut Dump)) -> PathBuf {
    let mut d = Dump::load(&reference()).unwrap();
    f(&mut d);
    let keep: Vec<(String, usize)> = d.tensors.keys().cloned().collect();
    d.manifest
        .checkpoints
        .retain(|e| keep.contains(&(e.name.clone(), e.step)));
    let out = dir.join(name);
    d.to_writer().write(&out).unwrap();
    out
}

fn compare(got: &Path, dir: &Path, extra: &[&str]) -> (i32, Value, String) {
    let ev = dir.join("e.json");
    let _ = std::fs::remove_file(&ev);
    let r = reference();
    let mut args = vec![
        "compare",
        r.to_str().unwrap(),
        got.to_str().unwrap(),
        "--evidence",
        ev.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = xray(&args);
    let e = std::fs::read_to_string(&ev)
        .map(|t| serde_json::from_str(&t).unwrap())
        .unwrap_or(Value::Null);
    (code(&o), e, stderr(&o))
}

const OBSERVED: [&str; 3] = [
    "audio.frontend.mel",
    "audio.encoder.memory",
    "audio.decoder.logits",
];

#[test]
fn partial_dump_passes_over_what_it_observes() {
    let dir = tempfile::tempdir().unwrap();
    let got = variant(dir.path(), "candle-like", |d| {
        d.tensors.retain(|(n, _), _| OBSERVED.contains(&n.as_str()))
    });
    let (c, e, err) = compare(&got, dir.path(), &[]);
    assert_eq!(c, 0, "{err}");
    assert_eq!(e["verdict"], "pass");
    let cov = &e["coverage"];
    assert_eq!(cov["observed"], 5, "mel, memory, logits at 3 steps: {cov}");
    assert_eq!(cov["unobserved"], 44);
    assert_eq!(
        cov["unobserved_names"],
        json!([
            "audio.encoder.conv1.out",
            "audio.encoder.conv2.out",
            "audio.encoder.layer.0..1.out",
            "audio.decoder.input_ids",
            "audio.decoder.position_ids",
            "audio.decoder.layer.0..1.*"
        ])
    );
    assert!(err.contains("44 unobserved"), "{err}");
    // --require-all: the same dump fails, the first absent checkpoint the origin.
    let (c, e, _) = compare(&got, dir.path(), &["--require-all"]);
    assert_eq!(c, 1);
    assert_eq!(
        e["first_divergence"]["checkpoint"],
        "audio.encoder.conv1.out"
    );
    assert_eq!(e["first_divergence"]["kind"], "missing");
    // The memory off: the origin, with the encoder region before it and its ops as suspects.
    let bad = variant(dir.path(), "bad-memory", |d| {
        d.tensors.retain(|(n, _), _| OBSERVED.contains(&n.as_str()));
        let m = d
            .tensors
            .get_mut(&("audio.encoder.memory".to_string(), 0))
            .unwrap();
        m.mapv_inplace(|x| x * 1.5);
    });
    let (c, e, err) = compare(&bad, dir.path(), &[]);
    assert_eq!(c, 1, "{err}");
    let fd = &e["first_divergence"];
    assert_eq!(fd["checkpoint"], "audio.encoder.memory");
    assert_eq!(
        fd["region"]["summary"],
        "between audio.frontend.mel@0 (pass) and audio.encoder.memory@0 (fail)"
    );
    assert_eq!(
        fd["suspects"],
        json!([
            "encoder.conv1",
            "encoder.conv2",
            "encoder.layer.0.residual_mlp",
            "encoder.layer.1.residual_mlp",
            "encoder.final_norm"
        ])
    );
    assert!(err.contains("suspects: encoder.conv1"), "{err}");
}

#[test]
fn a_cache_one_position_short_is_the_origin_named_in_axes() {
    let dir = tempfile::tempdir().unwrap();
    let got = variant(dir.path(), "short-cache", |d| {
        let k = ("audio.decoder.layer.1.self_attention.probs".to_string(), 2);
        let t = d.tensors[&k].clone();
        let n = t.shape()[2];
        d.tensors.insert(
            k,
            t.slice_axis(ndarray::Axis(2), (0..n - 1).into()).to_owned(),
        );
    });
    let (c, e, err) = compare(&got, dir.path(), &[]);
    assert_eq!(c, 1, "{err}");
    let fd = &e["first_divergence"];
    assert_eq!(
        fd["checkpoint"],
        "audio.decoder.layer.1.self_attention.probs"
    );
    assert_eq!(fd["step"], 2);
    assert_eq!(fd["kind"], "shape");
    assert_eq!(fd["explanation"]["signature"], "shape");
    assert_eq!(
        fd["explanation"]["detail"],
        "one key fewer along past+tokens (3 vs 4 in the reference): the cache lost a position"
    );
}

#[test]
fn tokens_part_and_later_steps_are_not_comparable() {
    let dir = tempfile::tempdir().unwrap();
    // Another token at step 1 (the fifth of prefix 2 + 3): step 2 ran on other tokens.
    let got = variant(dir.path(), "other-tokens", |d| {
        d.manifest.tokens[3] = 220;
    });
    let (c, e, err) = compare(&got, dir.path(), &[]);
    assert_eq!(c, 1, "{err}");
    assert_eq!(e["tokens"]["parted_at_step"], 1);
    assert_eq!(e["tokens"]["not_comparable_steps"], "2");
    assert_eq!(e["transcript"]["first_divergent_step"], 1);
    let st: Vec<&str> = e["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["step"] == 2)
        .map(|c| c["status"].as_str().unwrap())
        .collect();
    assert!(
        !st.is_empty() && st.iter().all(|s| *s == "not_comparable"),
        "{st:?}"
    );
    // Every compared tensor is the reference's: the divergence is the tokens, at step 1.
    assert_eq!(e["first_divergence"]["kind"], "tokens");
    assert_eq!(e["first_divergence"]["checkpoint"], "audio.decoder.logits");
    assert_eq!(e["first_divergence"]["step"], 1);
    // Teacher-forced: every step compared, the engine's own argmax says where it parts.
    let tf = variant(dir.path(), "teacher", |d| {
        d.manifest.tokens[3] = 220;
        d.manifest
            .extra
            .insert("fed".into(), json!({"tokens": {"from": "ref"}}));
        d.manifest
            .extra
            .insert("step_argmax".into(), json!([17301, 220, 17301]));
    });
    let (_, e, err) = compare(&tf, dir.path(), &[]);
    assert_eq!(e["tokens"]["teacher_forced"], true, "{err}");
    assert_eq!(e["tokens"]["parted_at_step"], 1);
    assert_eq!(e["coverage"]["not_comparable"], 0);
    assert_eq!(e["fed"][0]["checkpoint"], "tokens");
}

#[test]
fn refusals_name_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing in common: an error naming both dumps, never a pass.
    let empty = variant(dir.path(), "empty", |d| d.tensors.clear());
    let (c, _, err) = compare(&empty, dir.path(), &[]);
    assert_eq!(c, 2, "{err}");
    assert!(
        err.contains("nothing to compare") && err.contains("empty"),
        "{err}"
    );
    // The reference must cover what is compared.
    let ev = dir.path().join("e.json");
    let partial_ref = variant(dir.path(), "partial-ref", |d| {
        d.tensors
            .remove(&("audio.encoder.conv1.out".to_string(), 0));
    });
    let o = xray(&[
        "compare",
        partial_ref.to_str().unwrap(),
        reference().to_str().unwrap(),
        "--evidence",
        ev.to_str().unwrap(),
    ]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("audio.encoder.conv1.out@step0")
            && stderr(&o).contains("absent from the reference"),
        "{}",
        stderr(&o)
    );
    assert!(!ev.exists(), "no evidence on an error");
    // A fed edge that is not a checkpoint of the contract.
    let fed = variant(dir.path(), "bad-fed", |d| {
        d.manifest
            .extra
            .insert("fed".into(), json!({"audio.encoder.mem": {"from": "ref"}}));
    });
    let (c, _, err) = compare(&fed, dir.path(), &[]);
    assert_eq!(c, 2, "{err}");
    assert!(err.contains("audio.encoder.mem"), "{err}");
    // Steps numbered off by one (an adapter counting decode steps from 1: its step k holds the
    // reference's k - 1), told from the data, before anything is compared.
    let shifted = variant(dir.path(), "steps-from-one", |d| {
        let last = d.tensors.keys().map(|(_, s)| *s).max().unwrap();
        let tensors = std::mem::take(&mut d.tensors);
        d.tensors = tensors
            .into_iter()
            .filter(|((_, s), _)| *s < last)
            .map(|((n, s), t)| ((n, if s > 0 { s + 1 } else { 0 }), t))
            .collect();
        for e in d.manifest.checkpoints.iter_mut().filter(|e| e.step > 0) {
            e.step += 1;
        }
    });
    let (c, _, err) = compare(&shifted, dir.path(), &[]);
    assert_eq!(c, 2, "{err}");
    assert!(
        err.contains("numbered off by one")
            && err.contains("step k holds the reference's step k - 1"),
        "{err}"
    );
}

/// With `--model DIR` the suspects behind a gap are the runtime graph's ops between the last
/// passing checkpoint and the failing one: weightless and unlabelled ops included (the GELUs,
/// the layout change, the position table), nothing upstream of the passing mel.
#[test]
fn model_dir_gives_the_runtime_graph_ops_as_suspects() {
    let dir = tempfile::tempdir().unwrap();
    let got = dir.path().join("got");
    let o = dump_to(
        "run",
        "fixtures/build/whisper-rand-a",
        "fixtures/audio/fox.wav",
        &got,
        &[
            "--only",
            "audio.frontend.mel",
            "--only",
            "audio.encoder.memory",
            "--only",
            "audio.decoder.logits",
            "--inject",
            "layernorm_eps",
        ],
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let (c, ev, _) = compare(&got, dir.path(), &[]);
    assert_eq!(c, 1);
    let coarse: Vec<String> =
        serde_json::from_value(ev["first_divergence"]["suspects"].clone()).unwrap();
    let (c, ev, _) = compare(
        &got,
        dir.path(),
        &["--model", "fixtures/build/whisper-rand-a"],
    );
    assert_eq!(c, 1);
    let fd = &ev["first_divergence"];
    assert_eq!(fd["checkpoint"], "audio.encoder.memory");
    let ops: Vec<String> = serde_json::from_value(fd["suspects"].clone()).unwrap();
    for want in [
        "encoder.conv1",
        "encoder.conv1_gelu",
        "encoder.to_token_major",
        "encoder.embed_positions",
        "encoder.layer.1.mlp_norm",
        "encoder.layer.1.gelu",
        "encoder.final_norm",
    ] {
        assert!(ops.iter().any(|o| o == want), "{want} not in {ops:?}");
    }
    assert!(!ops.iter().any(|o| o.starts_with("frontend.")), "{ops:?}");
    assert!(ops.len() > coarse.len(), "{ops:?} vs {coarse:?}");
    // The planted op is among them.
    assert!(ops.iter().any(|o| o == "encoder.layer.1.mlp_norm"));
}

/// Declared precision (`extra.precision`): named whatever the policy; a policy's
/// `accept_precision` judges what a declared op reaches (X-Ray's graph of `--model`) at its
/// bounds and the rest at f32's, so a departure upstream of every declared op still fails; a
/// declaration that cannot be used is refused in one line, exit 2.
#[test]
fn declared_precision_is_accepted_downstream_of_the_declared_op_only() {
    const MODEL: &str = "fixtures/build/whisper-rand-a";
    if !common::ready(&[MODEL]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("accept-f16.json");
    std::fs::write(
        &policy,
        r#"{"accept_precision": {"f16": {"default": {"atol": 5e-2, "rtol": 2e-2, "max_outlier_fraction": 1e-2, "max_rel_l2": 1e-2}}}}"#,
    )
    .unwrap();
    let p = policy.to_str().unwrap();
    let model = root().join(MODEL);
    let m = model.to_str().unwrap();
    let declare = |d: &mut Dump, decl: Value| {
        d.manifest.extra.insert("precision".into(), decl);
    };
    let conv1 = json!([{"op": "encoder.conv1", "dtype": "f16", "why": "IM2COL to f16"}]);
    // Every tensor downstream of conv1 off by 0.3%: beyond f32 bounds, within f16's.
    let scaled = |names: &[&str], d: &mut Dump| {
        for ((n, _), t) in d.tensors.iter_mut() {
            if names.iter().any(|x| n == x) {
                t.mapv_inplace(|v| v * 1.003);
            }
        }
    };
    let downstream = variant(dir.path(), "downstream", |d| {
        declare(d, conv1.clone());
        scaled(&["audio.encoder.memory"], d);
    });
    let (c, e, err) = compare(&downstream, dir.path(), &[]);
    assert_eq!(c, 1, "{err}");
    assert!(
        err.contains(
            "precision: the engine declares 1 f16 op(s): encoder.conv1 computed below f32"
        ),
        "{err}"
    );
    assert_eq!(e["precision"]["declared"][0]["op"], "encoder.conv1");
    assert_eq!(e["precision"]["accepted"], json!([]));
    assert_eq!(e["first_divergence"]["checkpoint"], "audio.encoder.memory");
    let (c, e, err) = compare(&downstream, dir.path(), &["--policy", p, "--model", m]);
    assert_eq!(c, 0, "{err}");
    let source = |e: &Value, n: &str| {
        e["checkpoints"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == n)
            .unwrap()["tolerance"]["source"]
            .clone()
    };
    assert_eq!(
        source(&e, "audio.encoder.memory"),
        "precision:f16 via encoder.conv1"
    );
    assert_eq!(source(&e, "audio.frontend.mel"), "default:f32");
    assert!(e["precision"]["names_at_accepted_bounds"].as_u64().unwrap() > 10);
    // The same departure upstream of every declared op (the log-mel) fails as strictly as ever.
    let upstream = variant(dir.path(), "upstream", |d| {
        declare(d, conv1.clone());
        scaled(&["audio.frontend.mel"], d);
    });
    let (c, e, err) = compare(&upstream, dir.path(), &["--policy", p, "--model", m]);
    assert_eq!(c, 1, "{err}");
    assert_eq!(e["first_divergence"]["checkpoint"], "audio.frontend.mel");
    // Refusals: one line, exit 2, naming what is wrong.
    let one_line = |c: i32, err: &str, needle: &str| {
        assert_eq!(c, 2, "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{needle:?} not in {err}");
    };
    let (c, _, err) = compare(&downstream, dir.path(), &["--policy", p]);
    one_line(c, &err, "pass --model DIR");
    for (name, decl, needle) in [
        (
            "unknown-op",
            json!([{"op": "encoder.conv9", "dtype": "f16", "why": "x"}]),
            "'encoder.conv9' is no op of the whisper graph",
        ),
        (
            "bad-dtype",
            json!([{"op": "encoder.conv1", "dtype": "f8", "why": "x"}]),
            "declares dtype \"f8\"",
        ),
        (
            "not-a-list",
            json!({"op": "encoder.conv1"}),
            "extra.precision is not a list",
        ),
        (
            "twice",
            json!([{"op": "encoder.conv1", "dtype": "f16", "why": "x"}, {"op": "encoder.conv1", "dtype": "f16", "why": "y"}]),
            "declares encoder.conv1 twice",
        ),
    ] {
        let got = variant(dir.path(), name, |d| declare(d, decl));
        let (c, _, err) = compare(&got, dir.path(), &["--model", m]);
        one_line(c, &err, needle);
    }
}
