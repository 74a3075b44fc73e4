//! Op-level localization end to end: the drill-down of `xray check`, `--ops` dumps compared by
//! `xray compare`, and another engine's dump (the HF reference itself with int8-rounded fc2
//! weights, dumped by `python -m xray_oracle dump --ops`) localized to the module.

use crate::common;
use common::{GRANITE, RAND, TINY};

use std::path::Path;

use common::{
    assert_schema_valid, check_injected, code, compare_dumps, compare_output, dump_to, edited,
    oracle_dump, patched_oracle_dump, read_json, ready, ready_tempdir, s, stderr, FOX,
};
use serde_json::Value;

/// `xray compare REF GOT --model MODEL`: asserts the exit code, returns the evidence.
fn compare(r: &Path, x: &Path, model: &str, want: i32) -> Value {
    let dir = tempfile::tempdir().unwrap();
    compare_dumps(r, x, model, &dir.path().join("e.json"), want)
}

/// A fault the catalogue plants elsewhere (its default is encoder layer 1's MLP norm), planted on
/// encoder layer 0's attention norm: the drill-down follows the graph to that op, with the
/// normalization-statistics signature.
#[test]
fn check_drills_down_to_an_op_the_catalogue_does_not_target() {
    if !ready(&[RAND, FOX, ".venv"]) {
        return;
    }
    let ev = check_injected(RAND, "layernorm_eps@encoder.layer.0.self_attn_norm", &[]);
    let fd = &ev["first_divergence"];
    assert_eq!(fd["checkpoint"], "audio.encoder.layer.0.out", "{fd:#}");
    let op = &fd["op"];
    assert_eq!(op["op"], "encoder.layer.0.self_attn_norm", "{op:#}");
    assert_eq!(
        op["point"], "model.encoder.layers.0.self_attn_layer_norm:out",
        "{op:#}"
    );
    assert_eq!(op["inputs"][0]["status"], "pass", "{op:#}");
    assert_eq!(op["explanation"]["signature"], "row_affine", "{op:#}");
    assert_schema_valid(&ev);
    // --no-drill stops at the checkpoint.
    let ev = check_injected(
        RAND,
        "layernorm_eps@encoder.layer.0.self_attn_norm",
        &["--no-drill"],
    );
    assert!(ev["first_divergence"].get("op").is_none(), "{ev:#}");
}

/// `xray oracle --ops` and `xray run --ops` of `model` on fox.wav into `dir/ref`, `dir/rt`.
fn ops_pair(model: &str, dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (r, x) = (dir.join("ref"), dir.join("rt"));
    for (cmd, out) in [("oracle", &r), ("run", &x)] {
        let o = dump_to(cmd, model, FOX, out, &["--ops"]);
        assert_eq!(code(&o), 0, "xray {cmd} {model}: {}", stderr(&o));
    }
    (r, x)
}

fn point_count(d: &Path) -> usize {
    read_json(&d.join("manifest.json"))["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| xray_core::ops::is_point(e["name"].as_str().unwrap()))
        .count()
}

/// A clean run with every op-level point on both sides, for every bundled model of both
/// families: the points are aligned by the contract's declared rules (0 alignment faults) and
/// every point both engines hold agrees at every step, in numbers.
#[test]
fn clean_ops_pairs_align_and_agree_on_every_bundled_model() {
    for (model, min_shared) in [
        (RAND, 100),
        ("fixtures/build/whisper-rand-b", 100),
        (GRANITE, 150),
        (TINY, 300),
    ] {
        let Some(dir) = ready_tempdir(&[model, FOX, ".venv"]) else {
            continue;
        };
        let (r, x) = ops_pair(model, dir.path());
        assert!(
            point_count(&r) >= min_shared && point_count(&x) >= min_shared,
            "{model}"
        );
        let ev = compare(&r, &x, model, 0);
        let p = &ev["op_points"];
        assert_eq!(
            p["alignment_faults"],
            serde_json::json!([]),
            "{model}: {p:#}"
        );
        assert_eq!(p["failed_count"], 0, "{model}: {p:#}");
        let shared = p["shared"].as_u64().unwrap();
        assert!(shared >= min_shared as u64, "{model}: {p:#}");
        assert_eq!(
            p["pass"], shared,
            "{model}: every shared point compared and passing: {p:#}"
        );
        assert_eq!(
            p["engine_only"], 0,
            "{model}: the runtime names no point HF lacks: {p:#}"
        );
        let notes = ev["notes"].to_string();
        assert!(
            !notes.contains("differs while every checkpoint agrees"),
            "{model}: {notes}"
        );
        assert_schema_valid(&ev);
    }
}

/// A point the engine holds in another shape than the reference's declared form (here the
/// runtime's `fc1:in` one row short) is an alignment fault: in the evidence, on the console,
/// never the divergence, and the verdict is the checkpoints'.
#[test]
fn a_deliberately_unaligned_point_is_an_alignment_fault() {
    let Some(dir) = ready_tempdir(&[RAND, FOX, ".venv"]) else {
        return;
    };
    let (r, x) = ops_pair(RAND, dir.path());
    let point = "model.encoder.layers.0.fc1:in";
    let d = xray_core::dump::Dump::load(&x).unwrap();
    let mut m = d.manifest.clone();
    m.checkpoints.clear();
    let mut w = xray_core::dump::DumpWriter::new(m);
    for e in &d.manifest.checkpoints {
        let t = d.get(&e.name, e.step).unwrap();
        if e.name == point {
            let short = t
                .slice(ndarray::s![..t.shape()[0] - 1, ..])
                .to_owned()
                .into_dyn();
            w.add(&e.name, e.step, e.layout, &short);
        } else {
            w.add(&e.name, e.step, e.layout, t);
        }
    }
    let bad = dir.path().join("bad");
    w.write(&bad).unwrap();
    let (o, ev) = compare_output(&r, &bad, RAND, &dir.path().join("e.json"), 0);
    let faults = ev["op_points"]["alignment_faults"].as_array().unwrap();
    assert_eq!(faults.len(), 1, "{ev:#}");
    assert_eq!(faults[0]["point"], point);
    assert_eq!(faults[0]["reference"][0], serde_json::json!([250, 64]));
    assert_eq!(faults[0]["engine"][0], serde_json::json!([249, 64]));
    assert!(ev["first_divergence"].is_null(), "{ev:#}");
    let err = stderr(&o);
    assert!(
        err.contains(
            "1 alignment fault(s) (first: model.encoder.layers.0.fc1:in@step0: shapes differ"
        ),
        "{err}"
    );
    assert_schema_valid(&ev);
}

/// Another engine's dump: HF Whisper tiny.en with encoder layer 3's fc2 weight rounded to a
/// symmetric int8 grid per output row, dumped with every op-level point by the Python oracle.
/// `xray compare` against the reference names the module, the runtime op, and the grid.
#[test]
fn int8_rounded_fc2_in_another_engines_dump_is_localized_to_the_module() {
    let Some(dir) = ready_tempdir(&[TINY, FOX, ".venv"]) else {
        return;
    };
    let patched = edited(
        dir.path(),
        TINY,
        "tiny-int8-fc2",
        "k = 'model.encoder.layers.3.fc2.weight'\n\
         a = w[k].astype(np.float32)\n\
         s = np.abs(a).max(axis=1, keepdims=True) / 127.0\n\
         w[k] = (np.round(a / s) * s).astype(w[k].dtype)",
    );
    let r = oracle_dump(dir.path(), TINY);
    let x = patched_oracle_dump(dir.path(), s(&patched), "");
    let ev = compare(&r, &x, TINY, 1);
    let fd = &ev["first_divergence"];
    assert_eq!(fd["checkpoint"], "audio.encoder.layer.3.out", "{fd:#}");
    assert_eq!(fd["step"], 0, "{fd:#}");
    let op = &fd["op"];
    assert_eq!(op["module"], "model.encoder.layers.3.fc2", "{op:#}");
    assert_eq!(op["point"], "model.encoder.layers.3.fc2:out", "{op:#}");
    assert_eq!(op["op"], "encoder.layer.3.fc2", "{op:#}");
    let e = &op["explanation"];
    assert_eq!(e["signature"], "grid_quantization", "{e:#}");
    assert_eq!(e["evidence"]["bits"], 8, "{e:#}");
    assert_schema_valid(&ev);
}
