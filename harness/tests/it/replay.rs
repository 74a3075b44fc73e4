//! Reference replay end to end (`first_divergence.op.replay`): bugs planted in X-Ray's runtime
//! with `--inject`, bugs the fault catalogue does not have (a weights file edited the way
//! bring-up gets weights wrong, run by the runtime and compared with the ORIGINAL model as the
//! reference), and a weightless bug in another engine's dump (the HF reference with one residual
//! add patched). Each asserts the op replay convicts and the mechanism it names; the expectations
//! follow the op kinds (linear, norm, conv, embedding, attention, residual add), not the catalogue.

use crate::common;
use common::{GRANITE, RAND, TINY};

use std::path::{Path, PathBuf};

use common::{
    assert_schema_valid, check_injected, code, compare_dumps, compare_output, dump_to, edited,
    oracle_dump, patched_oracle_dump, ready, ready_tempdir, s, stderr, xray, FOX,
};
use serde_json::Value;

/// The strings of a JSON array.
fn strs_of(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The op-level origin's replay evidence, with the op it names.
fn replay(ev: &Value) -> (&Value, &Value) {
    let op = &ev["first_divergence"]["op"];
    assert!(
        op.is_object(),
        "no op-level origin: {:#}",
        ev["first_divergence"]
    );
    let r = &op["replay"];
    assert!(r.is_object(), "no replay: {op:#} notes {:#}", ev["notes"]);
    (op, r)
}

/// Asserts the op replay convicted and its mechanism's counterfactual kind; returns the mechanism.
fn convicted<'a>(ev: &'a Value, op_name: &str, kind: &str) -> &'a Value {
    let (op, r) = replay(ev);
    assert_eq!(op["op"], op_name, "{op:#}");
    assert_eq!(r["local_error"]["verdict"], "convicted", "{r:#}");
    let m = &r["mechanism"];
    assert_eq!(m["counterfactual"]["kind"], kind, "{:#}", r);
    assert!(m["residual"].as_f64().unwrap() < 1e-5, "{m:#}");
    assert!(
        m["residual"].as_f64().unwrap() <= 0.1 * r["local_error"]["rel_l2"].as_f64().unwrap(),
        "{m:#}"
    );
    m
}

/// `model`'s weights file edited by `edit` ([`edited`], as `dir/name`), then `xray run --model
/// EDITED --ops` and `xray compare REFERENCE GOT --model MODEL`: the evidence.
fn edited_and_compared(dir: &Path, reference: &Path, model: &str, name: &str, edit: &str) -> Value {
    let bad = edited(dir, model, name, edit);
    let got = dir.join(format!("{name}-dump"));
    let o = dump_to("run", s(&bad), FOX, &got, &["--ops"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let (o, ev) = compare_output(reference, &got, model, &dir.join(format!("{name}.json")), 1);
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(text.contains("xray: replay: "), "{text}");
    ev
}

/// For a test on `model` and fox.wav (guarded by [`ready_tempdir`]): a temporary directory and
/// the reference's dump with op-level points in it ([`oracle_dump`]).
fn referenced(model: &str) -> Option<(tempfile::TempDir, PathBuf)> {
    let dir = ready_tempdir(&[model, FOX, ".venv"])?;
    let reference = oracle_dump(dir.path(), model);
    Some((dir, reference))
}

/// The random-init Whisper's reference with a bug planted, dumped by the oracle as another
/// engine's dump ([`patched_oracle_dump`]) and compared with `reference` (a divergence): the
/// evidence. `forward` defines `fwd`, which replaces `class`'s forward (the original is `orig`)
/// and misbehaves where `self._bug` is set: on the loaded model's `buggy` module only.
fn patched_and_compared(
    dir: &Path,
    reference: &Path,
    class: &str,
    forward: &str,
    buggy: &str,
) -> Value {
    let patch = format!(
        "import transformers.models.whisper.modeling_whisper as mw\n\
         orig = mw.{class}.forward\n\
         {forward}\
         mw.{class}.forward = fwd\n\
         load = mw.WhisperForConditionalGeneration.from_pretrained.__func__\n\
         def patched(cls, *a, **k):\n\
         \x20   m = load(cls, *a, **k)\n\
         \x20   m.model.{buggy}._bug = True\n\
         \x20   return m\n\
         mw.WhisperForConditionalGeneration.from_pretrained = classmethod(patched)\n"
    );
    let got = patched_oracle_dump(dir, RAND, &patch);
    compare_dumps(reference, &got, RAND, &dir.join("e.json"), 1)
}

/// Faults planted in the runtime's kernels and parameters: the named op is convicted by its
/// replay and the mechanism is the counterfactual of its kind that reproduces the runtime.
#[test]
fn injected_faults_are_convicted_with_their_mechanism() {
    if !ready(&[RAND, FOX, ".venv"]) {
        return;
    }
    // A norm: epsilon solved (1e-1 where the module has 1e-5).
    let ev = check_injected(RAND, "layernorm_eps@encoder.layer.0.self_attn_norm", &[]);
    let m = convicted(&ev, "encoder.layer.0.self_attn_norm", "eps");
    assert_eq!(m["counterfactual"]["value"], 0.1, "{m:#}");
    let (_, r) = replay(&ev);
    assert_eq!(r["kind"], "layer_norm");
    assert_eq!(r["class"], "LayerNorm");
    assert_eq!(r["kernel"], "layer_norm");
    assert_eq!(r["replay_floor"], 0.0, "{r:#}");
    // Its neighbours in the region replay clean.
    let nb = r["neighbours"].as_array().unwrap();
    assert!(nb.len() >= 4, "{nb:#?}");
    assert!(
        nb.iter()
            .filter(|n| n["module"].as_str().unwrap().contains("layers.0"))
            .all(|n| n["verdict"] == "cleared"),
        "{nb:#?}"
    );
    assert_schema_valid(&ev);
    // A single-op origin (the encoder's final norm is the whole checkpoint): still replayed.
    let ev = check_injected(RAND, "layernorm_unbiased_var", &[]);
    convicted(&ev, "encoder.final_norm", "unbiased_variance");
    // A linear on an int8 grid.
    let ev = check_injected(RAND, "out_proj_int8", &[]);
    let m = convicted(&ev, "encoder.layer.1.out_proj", "weight_grid");
    assert_eq!(m["counterfactual"]["bits"], 8);
    assert_eq!(m["counterfactual"]["granularity"], "per_row");
    // A linear reading another layer's weight.
    let ev = check_injected(RAND, "cross_k_wrong_layer", &[]);
    let m = convicted(&ev, "decoder.layer.1.cross_k_proj", "other_key");
    assert_eq!(
        m["counterfactual"]["key"],
        "model.decoder.layers.0.encoder_attn.k_proj.weight"
    );
    // Weightless: an attention core with a causal mask it must not have, and one whose softmax
    // scale is sqrt(head_dim) instead of 1/sqrt(head_dim) (solved).
    let ev = check_injected(RAND, "causal_mask_added", &[]);
    let m = convicted(&ev, "encoder.layer.0.self_attn", "causal_mask");
    assert_eq!(m["counterfactual"]["on"], true);
    let ev = check_injected(RAND, "attn_scale_dropped@encoder.layer.1.self_attn", &[]);
    let m = convicted(&ev, "encoder.layer.1.self_attn", "attention_scale");
    assert!(
        (m["counterfactual"]["value"].as_f64().unwrap() - 4.0).abs() < 1e-6,
        "{m:#}"
    );
    assert_schema_valid(&ev);
    // An attention core the contract exposes as its own checkpoint (decoder cross-attention
    // context): drilled into at the points around it.
    let ev = check_injected(RAND, "attn_scale_dropped", &[]);
    let (op, r) = replay(&ev);
    assert_eq!(r["kind"], "attention", "{r:#}");
    assert!(
        op["suspects"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == "decoder.layer.1.cross_attn"),
        "{op:#}"
    );
    assert_eq!(r["mechanism"]["counterfactual"]["kind"], "attention_scale");
    // Weightless and elementwise: GELU's tanh approximation where the reference has the exact
    // GELU; the reference's function is identified on its own tensors, the runtime's is named.
    let ev = check_injected(RAND, "gelu_tanh@encoder.layer.0.gelu", &[]);
    let m = convicted(&ev, "encoder.layer.0.gelu", "activation");
    assert_eq!(m["counterfactual"]["function"], "tanh_gelu", "{m:#}");
    assert!(m["counterfactual"].get("table").is_none(), "{m:#}");
    let (_, r) = replay(&ev);
    assert_eq!(r["kind"], "elementwise", "{r:#}");
    assert!(r["replay_floor"].as_f64().unwrap() < 1e-6, "{r:#}");
    assert_schema_valid(&ev);
    // A residual add skipped (granite's self-conditioning bypass): the input dropped is named.
    if ready(&[GRANITE]) {
        let ev = check_injected(GRANITE, "ctc_bypass_skipped", &[]);
        let m = convicted(&ev, "enc.self_cond.bypass_add", "input_dropped");
        assert_eq!(m["counterfactual"]["input"], "encoder.out_mid:out", "{m:#}");
        assert_schema_valid(&ev);
    }
}

/// Bugs in the weights file, none of them in the fault catalogue: the runtime runs the edited
/// model, the reference is the original, and `xray compare --model ORIGINAL` replays the first
/// op that differs on the runtime's own input.
#[test]
fn weights_read_wrong_are_named_by_replay() {
    let Some((dir, reference)) = referenced(RAND) else {
        return;
    };
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "q-transposed",
            "k = 'model.encoder.layers.0.self_attn.q_proj.weight'; w[k] = w[k].T.copy()",
            "encoder.layer.0.q_proj",
            "transpose_weight",
        ),
        (
            "fc1-bias-zero",
            "k = 'model.encoder.layers.1.fc1.bias'; w[k] = np.zeros_like(w[k])",
            "encoder.layer.1.fc1",
            "bias_missing",
        ),
        (
            "fc2-layers-swapped",
            "a, b = 'model.encoder.layers.0.fc2.weight', 'model.encoder.layers.1.fc2.weight'; w[a], w[b] = w[b].copy(), w[a].copy()",
            "encoder.layer.0.fc2",
            "other_key",
        ),
        (
            // Whole layers loaded in the wrong order: the first module of layer 0 reads every
            // parameter from layer 1's.
            "layers-swapped",
            "for k in [k for k in w if k.startswith('model.encoder.layers.0.')]:\n    o = k.replace('layers.0.', 'layers.1.'); w[k], w[o] = w[o].copy(), w[k].copy()",
            "encoder.layer.0.self_attn_norm",
            "other_module",
        ),
        (
            "ln-affine-swapped",
            "p = 'model.encoder.layers.0.final_layer_norm.'; w[p + 'weight'], w[p + 'bias'] = w[p + 'bias'].copy(), w[p + 'weight'].copy()",
            "encoder.layer.0.mlp_norm",
            "affine_swapped",
        ),
        (
            "ln-weight-missing",
            "k = 'model.encoder.layers.1.self_attn_layer_norm.weight'; w[k] = np.ones_like(w[k])",
            "encoder.layer.1.self_attn_norm",
            "norm_weight_missing",
        ),
        (
            "conv1-flipped",
            "k = 'model.encoder.conv1.weight'; w[k] = w[k][..., ::-1].copy()",
            "encoder.conv1",
            "kernel_flipped",
        ),
        (
            "fc1-layout",
            "k = 'model.encoder.layers.0.fc1.weight'; o, i = w[k].shape; w[k] = w[k].reshape(i, o).T.copy()",
            "encoder.layer.0.fc1",
            "weight_reinterpreted",
        ),
        (
            "fc1-f16",
            "k = 'model.encoder.layers.1.fc1.weight'; w[k] = w[k].astype(np.float16).astype(np.float32)",
            "encoder.layer.1.fc1",
            "weight_rounded",
        ),
        (
            // A converter's rotary permute (HF's llama `permute`) applied to a model without
            // rotary positions: q's rows interleaved within each head, its bias with them.
            "q-rows-interleaved",
            "p = 'model.encoder.layers.1.self_attn.q_proj.'; r = lambda a: a.reshape(4, 8, 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)\nw[p + 'weight'], w[p + 'bias'] = r(w[p + 'weight']), r(w[p + 'bias'])",
            "encoder.layer.1.q_proj",
            "features_permuted",
        ),
        (
            // A dequantization scale off: the weight halved, its bias untouched.
            "fc2-weight-halved",
            "k = 'model.encoder.layers.0.fc2.weight'; w[k] = w[k] * np.float32(0.5)",
            "encoder.layer.0.fc2",
            "weight_scaled",
        ),
        (
            // Positions off by one where the reference adds its table inline (no HF module to
            // re-run): replayed through X-Ray's kernels for the declared ops.
            "enc-positions-off-by-one",
            "k = 'model.encoder.embed_positions.weight'; w[k] = np.roll(w[k], -1, axis=0).copy()",
            "encoder.embed_positions",
            "row_offset",
        ),
        (
            "enc-positions-never-added",
            "k = 'model.encoder.embed_positions.weight'; w[k] = np.zeros_like(w[k])",
            "encoder.embed_positions",
            "weight_missing",
        ),
        (
            // A `(1 + w)` convention read the other way: the converter stored `w - 1` for an
            // engine that does not add the one back.
            "ln-weight-minus-one",
            "k = 'model.encoder.layers.0.self_attn_layer_norm.weight'; w[k] = w[k] - np.float32(1)",
            "encoder.layer.0.self_attn_norm",
            "weight_offset",
        ),
        (
            "embed-scaled",
            "k = 'model.decoder.embed_tokens.weight'; w[k] = w[k] * np.float32(8.0)",
            "decoder.embed_tokens",
            "output_scale",
        ),
    ];
    let mut table = Vec::new();
    for (name, edit, op, kind) in cases {
        let ev = edited_and_compared(dir.path(), &reference, RAND, name, edit);
        let m = convicted(&ev, op, kind);
        table.push(format!("{name}: {}", m["summary"]));
        match *name {
            "fc2-layers-swapped" => assert_eq!(
                m["counterfactual"]["key"],
                "model.encoder.layers.1.fc2.weight"
            ),
            "fc1-f16" => assert_eq!(m["counterfactual"]["format"], "f16"),
            "fc1-bias-zero" => {
                // The dump under test declares the edited weights: the evidence records them,
                // and `xray repro` cuts a case from it (the reference's weights, the engine's
                // output), holding that dump to them and no other.
                let declared = ev["run"]["dumps"]["got_weights_sha256"].as_str().unwrap();
                assert_ne!(Some(declared), ev["run"]["weights_sha256"].as_str());
                let evidence = dir.path().join(format!("{name}.json"));
                let case = dir.path().join("fc1-case");
                let o = xray(&["repro", s(&evidence), "--out", s(&case)]);
                assert_eq!(code(&o), 0, "{}", stderr(&o));
                assert!(
                    stderr(&o).contains("the runtime output fails"),
                    "{}",
                    stderr(&o)
                );
                let mut other = ev.clone();
                other["run"]["dumps"]["got_weights_sha256"] = Value::from("0".repeat(64));
                let tampered = dir.path().join("fc1-other.json");
                std::fs::write(&tampered, other.to_string()).unwrap();
                let o = xray(&["repro", s(&tampered), "--out", s(&dir.path().join("c2"))]);
                assert_eq!(code(&o), 2, "{}", stderr(&o));
                assert!(
                    stderr(&o).contains("made on other weights"),
                    "{}",
                    stderr(&o)
                );
            }
            "ln-weight-minus-one" => {
                assert!((m["counterfactual"]["value"].as_f64().unwrap() + 1.0).abs() < 1e-4);
                assert!(
                    m["summary"]
                        .as_str()
                        .unwrap()
                        .contains("with 1 subtracted from its weight"),
                    "{m:#}"
                );
            }
            "fc2-weight-halved" => {
                assert!((m["counterfactual"]["factor"].as_f64().unwrap() - 0.5).abs() < 1e-4);
            }
            "enc-positions-off-by-one" => {
                assert_eq!(m["counterfactual"]["by"], 1, "{m:#}");
                let (_, r) = replay(&ev);
                assert_eq!(r["kind"], "inline", "{r:#}");
                assert!(r["replay_floor"].as_f64().unwrap() < 1e-5, "{r:#}");
                // It re-runs no HF module: the Python-free build replays it the same way.
                let nopy = Path::new(env!("CARGO_BIN_EXE_xray")).with_file_name("xray-nopy");
                if xray_core::testing::require_all(&[&nopy], "run `make test-nopy`") {
                    let out = dir.path().join("nopy.json");
                    let got = dir.path().join(format!("{name}-dump"));
                    let o = std::process::Command::new(&nopy)
                        .args(["compare", s(&reference), s(&got), "--model", RAND])
                        .args(["--evidence", s(&out)])
                        .current_dir(common::root())
                        .output()
                        .unwrap();
                    assert_eq!(code(&o), 1, "{}", stderr(&o));
                    let np = common::read_json(&out);
                    assert_eq!(replay(&np).1["mechanism"], r["mechanism"]);
                }
            }
            "q-rows-interleaved" => {
                let slots = m["counterfactual"]["slots"].as_array().unwrap();
                assert_eq!(slots.len(), 64);
                // Head 0's rows: 0, 2, 4, ... then 1, 3, 5, ...
                assert_eq!(slots[..3], [0, 2, 4].map(serde_json::Value::from));
                assert_eq!(slots[8], 1);
            }
            "embed-scaled" => {
                assert!((m["counterfactual"]["factor"].as_f64().unwrap() - 8.0).abs() < 1e-4);
                assert_eq!(m["hint"], "sqrt(64)", "{m:#}");
            }
            _ => {}
        }
        assert_schema_valid(&ev);
    }
    eprintln!("{}", table.join("\n"));
}

/// Granite NAR: weights read wrong (the conformer's non-square input projection in the other
/// layout, a bias doubled, and tables its reference reads inline).
#[test]
fn granite_weights_read_wrong_are_named_by_replay() {
    let Some((dir, reference)) = referenced(GRANITE) else {
        return;
    };
    for (name, edit, op, kind) in [
        (
            "input-linear-layout",
            "k = 'encoder.input_linear.weight'; o, i = w[k].shape; w[k] = w[k].reshape(i, o).T.copy()",
            "enc.input_linear",
            "weight_reinterpreted",
        ),
        (
            // A converter that stored the standard deviation where the running variance belongs.
            "bn-var-as-std",
            "k = 'encoder.layers.1.conv.batch_norm.running_var'; w[k] = np.sqrt(w[k]).astype(np.float32)",
            "enc.block.1.conv.batch_norm",
            "running_var_power",
        ),
        (
            "ff1-up-bias-doubled",
            "k = 'encoder.layers.0.ff1.up_proj.bias'; w[k] = 2 * w[k]",
            "enc.block.0.ff1.up_proj",
            "bias_doubled",
        ),
        // Tables the reference reads inline (no HF module to re-run), replayed through X-Ray's
        // kernels: the Q-Former's window positions never added, its queries scaled, the
        // conformer's relative positions read one row off.
        (
            "window-positions-zero",
            "k = 'projector.window_positions'; w[k] = np.zeros_like(w[k])",
            "proj.kv_positions",
            "weight_missing",
        ),
        (
            "queries-doubled",
            "k = 'projector.query'; w[k] = w[k] * np.float32(2)",
            "proj.query_init",
            "weight_scaled",
        ),
        // The conformer's attention core, re-run by the oracle from the runtime's own q and kv
        // (the contract's attention rule: keys and values are the halves of to_kv:out): its
        // relative-position table stored reversed is the distance looked up as j - i.
        (
            "rel-pos-reversed",
            "k = 'encoder.layers.0.attn.rel_pos_emb.weight'; w[k] = w[k][::-1].copy()",
            "enc.block.0.attn.shaw",
            "distance_mirrored",
        ),
        (
            "rel-pos-one-row-off",
            "k = 'encoder.layers.1.attn.rel_pos_emb.weight'; w[k] = np.roll(w[k], 1, axis=0).copy()",
            "enc.block.1.attn.shaw",
            "row_offset",
        ),
    ] {
        let ev = edited_and_compared(dir.path(), &reference, GRANITE, name, edit);
        let m = convicted(&ev, op, kind);
        match name {
            "queries-doubled" => {
                assert!((m["counterfactual"]["factor"].as_f64().unwrap() - 2.0).abs() < 1e-4)
            }
            "rel-pos-one-row-off" => assert_eq!(m["counterfactual"]["by"], -1, "{m:#}"),
            "bn-var-as-std" => assert_eq!(m["counterfactual"]["value"], 0.5, "{m:#}"),
            _ => {}
        }
        assert_schema_valid(&ev);
    }
    // The depthwise conv's HF module takes an input its wrapper padded, which no kernel holds:
    // its region (the GLU and the conv, from the up-projection's output) is replayed through
    // X-Ray's kernels, and convicted; the kernel the conv declares it convolves along time
    // (`Kernel::time_kernel`), flipped, reproduces the engine and names the op.
    let flip = "k = 'encoder.layers.0.conv.depth_conv.conv.weight'; w[k] = w[k][..., ::-1].copy()";
    let ev = edited_and_compared(dir.path(), &reference, GRANITE, "depthwise-flipped", flip);
    let (op, r) = replay(&ev);
    assert_eq!(
        op["point"], "encoder.layers.0.conv.depth_conv.conv:out",
        "{op:#}"
    );
    assert_eq!(r["kind"], "inline", "{r:#}");
    assert_eq!(r["local_error"]["verdict"], "convicted", "{r:#}");
    assert!(
        strs_of(&r["covers"]).contains(&"enc.block.0.conv.depth_conv"),
        "{r:#}"
    );
    assert_eq!(
        r["mechanism"]["counterfactual"]["kind"], "kernel_flipped",
        "{r:#}"
    );
    assert_eq!(op["op"], "enc.block.0.conv.depth_conv", "{op:#}");
    assert_schema_valid(&ev);
}

/// A real model: Whisper tiny.en with encoder layer 2's fc1 bias missing from its weights.
#[test]
fn tiny_en_missing_bias_is_named_by_replay() {
    let Some((dir, reference)) = referenced(TINY) else {
        return;
    };
    let zero = "k = 'model.encoder.layers.2.fc1.bias'; w[k] = np.zeros_like(w[k])";
    let ev = edited_and_compared(dir.path(), &reference, TINY, "tiny-fc1-bias", zero);
    let m = convicted(&ev, "encoder.layer.2.fc1", "bias_missing");
    assert!(
        m["summary"]
            .as_str()
            .unwrap()
            .contains("model.encoder.layers.2.fc1 without its bias"),
        "{m:#}"
    );
}

/// Another engine's dump with a bug, the HF reference patched and dumped by the Python oracle:
/// encoder layer 1 adding its MLP branch twice (a residual multiplier applied twice: the
/// residual add convicted, its multiplier solved); its MLP norm an RMSNorm kernel (the mean not
/// subtracted); the decoder's final norm forgotten (its point holds the norm's input).
#[test]
fn bugs_in_another_engines_dump_are_named() {
    let Some((dir, reference)) = referenced(RAND) else {
        return;
    };
    let residual = "def fwd(self, hidden_states, attention_mask=None, **kw):\n\
        \x20   if not getattr(self, '_bug', False):\n\
        \x20       return orig(self, hidden_states, attention_mask, **kw)\n\
        \x20   h, _ = self.self_attn(hidden_states=self.self_attn_layer_norm(hidden_states), attention_mask=attention_mask, **kw)\n\
        \x20   h = hidden_states + h\n\
        \x20   return h + 2.0 * self.fc2(self.activation_fn(self.fc1(self.final_layer_norm(h))))\n";
    let norm = |bug: &str| {
        format!(
            "def fwd(self, x):\n\
             \x20   return ({bug}) if getattr(self, '_bug', False) else orig(self, x)\n"
        )
    };
    let rms = "x / (x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt() * self.weight + self.bias";
    for (class, forward, buggy, op, kind) in [
        (
            "WhisperEncoderLayer",
            residual.to_string(),
            "encoder.layers[1]",
            "encoder.layer.1.residual_mlp",
            "input_scaled",
        ),
        (
            "nn.LayerNorm",
            norm(rms),
            "encoder.layers[1].final_layer_norm",
            "encoder.layer.1.mlp_norm",
            "not_centered",
        ),
        (
            "nn.LayerNorm",
            norm("x"),
            "decoder.layer_norm",
            "decoder.final_norm",
            "skipped",
        ),
    ] {
        let case = dir.path().join(kind);
        std::fs::create_dir(&case).unwrap();
        let ev = patched_and_compared(&case, &reference, class, &forward, buggy);
        let m = convicted(&ev, op, kind);
        if kind == "input_scaled" {
            assert_eq!(
                m["counterfactual"]["input"], "model.encoder.layers.1.fc2:out",
                "{m:#}"
            );
            assert!((m["counterfactual"]["factor"].as_f64().unwrap() - 2.0).abs() < 1e-4);
        }
        assert_schema_valid(&ev);
    }
}

/// The random-init Whisper's reference with `WhisperAttention.forward` patched on module `buggy`
/// (under the model's `model.`): `body` runs first (indented lines with `self`, `hidden_states`,
/// `key_value_states`, `cache` and `kw` in scope), then the original forward; compared with the
/// reference ([`patched_and_compared`]): the evidence.
fn attention_patched(body: &str, buggy: &str) -> Option<Value> {
    let (dir, reference) = referenced(RAND)?;
    let forward = format!(
        "def fwd(self, hidden_states, key_value_states=None, cache=None, **kw):\n{body}\
         \x20   return orig(self, hidden_states, key_value_states=key_value_states, cache=cache, **kw)\n"
    );
    Some(patched_and_compared(
        dir.path(),
        &reference,
        "WhisperAttention",
        &forward,
        buggy,
    ))
}

/// Another engine's dump with its cross-attention cache indexed by the wrong layer: the HF
/// reference whose decoder layer 1 reads layer 0's cross-attention keys and values from step 1
/// on (the steps that reuse the cache). The attention core is convicted and the layer named.
#[test]
fn a_cross_attention_cache_of_another_layer_is_named() {
    let body = "\x20   if getattr(self, '_bug', False) and key_value_states is not None and cache is not None and cache.is_updated.get(self.layer_idx):\n\
        \x20       layers = cache.cross_attention_cache.layers\n\
        \x20       own = layers[self.layer_idx]\n\
        \x20       layers[self.layer_idx] = layers[0]\n\
        \x20       try:\n\
        \x20           return orig(self, hidden_states, key_value_states=key_value_states, cache=cache, **kw)\n\
        \x20       finally:\n\
        \x20           layers[self.layer_idx] = own\n";
    let Some(ev) = attention_patched(body, "decoder.layers[1].encoder_attn") else {
        return;
    };
    assert_eq!(
        ev["first_divergence"]["step"], 1,
        "{:#}",
        ev["first_divergence"]
    );
    let m = convicted(&ev, "decoder.layer.1.cross_attn", "kv_other_layer");
    assert_eq!(
        ev["first_divergence"]["op"]["replay"]["implicates"],
        "decoder.layer.1.cross_attn"
    );
    assert_eq!(m["counterfactual"]["layer"], 0, "{m:#}");
    assert_schema_valid(&ev);
}

/// Another engine's dump whose decoder carries its self-attention cache wrong between steps: from
/// step 1 on, layer 1 reads back its keys where its values were (a host-side bug: the append
/// writes them right). The values point is the op-level origin, with the `carried` signature: the
/// rows read back are not what the engine wrote at step 0, they hold the reference's keys, and
/// the step's own row agrees.
#[test]
fn a_self_attention_cache_carried_wrong_is_named() {
    let body = "\x20   if getattr(self, '_bug', False) and cache is not None and hidden_states.shape[1] == 1:\n\
        \x20       layer = cache.self_attention_cache.layers[self.layer_idx]\n\
        \x20       layer.values = layer.keys.clone()\n";
    let Some(ev) = attention_patched(body, "decoder.layers[1].self_attn") else {
        return;
    };
    let op = &ev["first_divergence"]["op"];
    assert_eq!(
        op["point"], "model.decoder.layers.1.self_attn:values",
        "{op:#}"
    );
    assert_eq!(op["step"], 1, "{op:#}");
    assert!(
        strs_of(&op["suspects"]).contains(&"decoder.layer.1.self_v_append"),
        "{op:#}"
    );
    let x = &op["explanation"];
    assert_eq!(x["signature"], "carried", "{x:#}");
    assert_eq!(
        x["evidence"]["written"],
        "model.decoder.layers.1.self_attn:values@step0"
    );
    assert_eq!(
        x["evidence"]["source"],
        "model.decoder.layers.1.self_attn:keys@step0"
    );
    assert_eq!(x["evidence"]["new_rows_agree"], true, "{x:#}");
    assert_schema_valid(&ev);
}
