//! The new signatures through the whole comparison pipeline on a real reference dump (the
//! committed HF oracle dump of whisper-rand-a on fox.wav): a runtime dump is the reference with
//! one realistic bug applied to one tensor, as another engine would write it, and
//! `compare_dumps` must localize it and name the signature with its parameter.

use std::path::PathBuf;

use ndarray::{ArrayD, Axis};
use xray_compare::compare::compare_dumps;
use xray_compare::compare::CompareOptions;
use xray_compare::signatures::{explain_with, ExplainOptions, OpContext};
use xray_core::contract::Contract;
use xray_core::dump::Dump;

fn reference() -> (Dump, Contract) {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/dumps/whisper-rand-a.fox");
    let d = Dump::load(&dir).expect("committed reference dump");
    let config = d
        .manifest
        .extra
        .get("config")
        .cloned()
        .expect("the manifest records the model config");
    let c = Contract::for_family("whisper", &config).expect("whisper contract");
    (d, c)
}

/// The runtime dump: the reference with `name@step` replaced by `f(reference tensor)`.
fn with(d: &Dump, name: &str, step: usize, f: impl Fn(&Dump, &ArrayD<f32>) -> ArrayD<f32>) -> Dump {
    let mut run = d.clone();
    let t = d.get(name, step).expect("tensor in the reference dump");
    let new = f(d, t);
    run.tensors.insert((name.to_string(), step), new);
    run
}

fn origin(
    reference: &Dump,
    contract: &Contract,
    runtime: &Dump,
) -> (String, usize, String, serde_json::Value, String) {
    let c = compare_dumps(
        contract,
        reference,
        runtime,
        None,
        &CompareOptions::default(),
    )
    .expect("comparison");
    let fd = c.first_divergence.expect("an origin");
    let ex = fd.explanation.expect("an explanation");
    (
        fd.checkpoint,
        fd.step,
        ex.signature.to_string(),
        ex.evidence,
        ex.detail,
    )
}

#[test]
fn decoder_layer_reading_another_layers_cross_cache_is_wiring() {
    let (d, c) = reference();
    let run = with(&d, "audio.decoder.layer.1.cross_k", 0, |d, _| {
        d.get("audio.decoder.layer.0.cross_k", 0).unwrap().clone()
    });
    let (name, step, sig, ev, detail) = origin(&d, &c, &run);
    assert_eq!((name.as_str(), step), ("audio.decoder.layer.1.cross_k", 0));
    assert_eq!(sig, "wiring", "{detail}");
    assert_eq!(ev["source"], "audio.decoder.layer.0.cross_k@step0");
}

#[test]
fn log_mel_with_a_higher_floor_is_a_clamp() {
    let (d, c) = reference();
    let mel = d.get("audio.frontend.mel", 0).unwrap();
    let floor = mel.iter().cloned().fold(f32::INFINITY, f32::min);
    // The runtime floors at max - 7 instead of max - 8 (after (x + 4) / 4: a quarter higher).
    let run_floor = floor + 0.25;
    let run = with(&d, "audio.frontend.mel", 0, |_, t| {
        t.mapv(|v| v.max(run_floor))
    });
    let (name, _, sig, ev, detail) = origin(&d, &c, &run);
    assert_eq!(name, "audio.frontend.mel");
    assert_eq!(sig, "clamp", "{detail}");
    assert_eq!(ev["side"], "below");
    let rr = ev["runtime_range"].as_array().unwrap();
    assert_eq!(rr[0], rr[1], "{detail}");
    assert!((rr[0].as_f64().unwrap() - run_floor as f64).abs() < 1e-6);
    assert!(ev["threshold"].as_f64().unwrap() < run_floor as f64);
}

#[test]
fn decode_step_attention_with_scaled_scores_is_a_temperature() {
    let (d, c) = reference();
    let k = 1.25f64;
    let run = with(
        &d,
        "audio.decoder.layer.0.self_attention.probs",
        2,
        |_, t| {
            let mut out = t.clone();
            for mut row in out.lanes_mut(Axis(2)) {
                let s: Vec<f64> = row
                    .iter()
                    .map(|p| {
                        if *p > 0.0 {
                            k * (*p as f64).ln()
                        } else {
                            f64::NEG_INFINITY
                        }
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
                for (o, v) in row.iter_mut().zip(&s) {
                    *o = ((v - m).exp() / z) as f32;
                }
            }
            out
        },
    );
    let (name, step, sig, ev, detail) = origin(&d, &c, &run);
    assert_eq!(
        (name.as_str(), step),
        ("audio.decoder.layer.0.self_attention.probs", 2)
    );
    assert_eq!(sig, "temperature", "{detail}");
    let f = ev["factor"].as_f64().unwrap();
    assert!((f - k).abs() < 1e-3, "{f}");
}

#[test]
fn encoder_final_norm_with_the_unbiased_variance_names_it() {
    let (d, c) = reference();
    let mem = d.get("audio.encoder.memory", 0).unwrap();
    let n = mem.shape()[1] as f32;
    let a = ((n - 1.0) / n).sqrt();
    let run = with(&d, "audio.encoder.memory", 0, |_, t| t.mapv(|v| a * v));
    let (name, _, sig, ev, detail) = origin(&d, &c, &run);
    assert_eq!(name, "audio.encoder.memory");
    // The random-init fixture's norm has no bias: one slope for all rows, a scale.
    assert_eq!(sig, "scale", "{detail}");
    assert!(
        ev["hint"].as_str().unwrap().contains("unbiased"),
        "{detail}"
    );
}

#[test]
fn one_head_read_from_another_layers_cache_is_a_subset_with_its_source() {
    let (d, c) = reference();
    let run = with(&d, "audio.decoder.layer.1.cross_v", 0, |d, t| {
        let mut out = t.clone();
        let other = d.get("audio.decoder.layer.0.cross_v", 0).unwrap();
        out.index_axis_mut(Axis(0), 3)
            .assign(&other.index_axis(Axis(0), 3));
        out
    });
    let (name, _, sig, ev, detail) = origin(&d, &c, &run);
    assert_eq!(name, "audio.decoder.layer.1.cross_v");
    assert_eq!(sig, "subset", "{detail}");
    assert_eq!(ev["indices"], serde_json::json!([3]));
    assert_eq!(
        ev["sources"],
        serde_json::json!([[3, "audio.decoder.layer.0.cross_v@step0"]]),
        "{detail}"
    );
    assert!(detail.contains("heads"), "{detail}");
}

/// Symmetric per-row int8 rounding.
fn int8_rows(w: &ndarray::Array2<f32>) -> ndarray::Array2<f32> {
    let mut q = w.clone();
    for mut row in q.axis_iter_mut(Axis(0)) {
        let s = row.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        row.mapv_inplace(|v| (v / s).round() * s);
    }
    q
}

#[test]
fn cross_k_projection_with_an_int8_weight_is_grid_quantization() {
    let (d, c) = reference();
    let st = std::fs::read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../fixtures/build/whisper-rand-a/model.safetensors"),
    )
    .expect("fixture weights (make fixtures)");
    let st = safetensors::SafeTensors::deserialize(&st).unwrap();
    let view = st
        .tensor("model.decoder.layers.1.encoder_attn.k_proj.weight")
        .unwrap();
    let w: Vec<f32> = view
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let (o, i) = (view.shape()[0], view.shape()[1]);
    let w = ndarray::Array2::from_shape_vec((o, i), w).unwrap();
    let wq = int8_rows(&w);
    let mem = d.get("audio.encoder.memory", 0).unwrap().clone();
    let mem = mem.into_dimensionality::<ndarray::Ix2>().unwrap();
    let run = with(&d, "audio.decoder.layer.1.cross_k", 0, |_, t| {
        // The runtime's k_proj with the int8 weight (no bias), split into heads.
        let y = mem.mapv(|v| v as f64).dot(&wq.mapv(|v| v as f64).t());
        let (h, tt, hd) = (t.shape()[0], t.shape()[1], t.shape()[2]);
        let y = y
            .into_shape_with_order((tt, h, hd))
            .unwrap()
            .permuted_axes([1, 0, 2]);
        y.mapv(|v| v as f32).into_dyn()
    });
    // The pipeline localizes it; its input (the encoder memory, a LayerNorm output) has one
    // linear relation among its features, so the weight cannot be recovered from the dump alone:
    // nothing is claimed without it.
    let (name, _, sig, _, detail) = origin(&d, &c, &run);
    assert_eq!(name, "audio.decoder.layer.1.cross_k");
    assert_eq!(sig, "none", "{detail}");
    // With the weight (the caller has the model folder) the op's input and both outputs name the
    // grid: int8, per output row.
    let (r, x) = (
        d.get("audio.decoder.layer.1.cross_k", 0).unwrap(),
        run.get("audio.decoder.layer.1.cross_k", 0).unwrap(),
    );
    let mem_dyn = mem.clone().into_dyn();
    let oc = OpContext {
        op_input: Some(mem_dyn.view()),
        weight: Some(w.view()),
        ..Default::default()
    };
    let e = explain_with(&r.view(), &x.view(), &ExplainOptions::default(), &oc);
    assert_eq!(e.signature.as_str(), "grid_quantization", "{}", e.detail);
    assert_eq!(e.evidence["bits"], 8, "{}", e.detail);
    assert_eq!(e.evidence["granularity"], "per_row", "{}", e.detail);
    assert_eq!(e.evidence["weight_recovered"], false);
    // The same weight with a clean runtime: f32 noise only, no grid.
    let clean = r.mapv(|v| v * (1.0 + 1e-7));
    let e = explain_with(&r.view(), &clean.view(), &ExplainOptions::default(), &oc);
    assert_ne!(e.signature.as_str(), "grid_quantization");
}

/// A fixture weight as f32 values.
fn fixture_f32(key: &str) -> Vec<f32> {
    let st = std::fs::read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../fixtures/build/whisper-rand-a/model.safetensors"),
    )
    .expect("fixture weights (make fixtures)");
    let st = safetensors::SafeTensors::deserialize(&st).unwrap();
    st.tensor(key)
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn encoder_final_norm_with_its_bias_and_the_unbiased_variance_is_row_affine() {
    let (d, c) = reference();
    // The fixture's final norm has a bias: X - β = a (R - β), a = sqrt((n-1)/n).
    let beta = fixture_f32("model.encoder.layer_norm.bias");
    let mem = d.get("audio.encoder.memory", 0).unwrap();
    let n = mem.shape()[1];
    assert_eq!(beta.len(), n);
    let a = ((n as f64 - 1.0) / n as f64).sqrt();
    let run = with(&d, "audio.encoder.memory", 0, |_, t| {
        let mut x = t.clone();
        for mut row in x.axis_iter_mut(Axis(0)) {
            for (v, b) in row.iter_mut().zip(&beta) {
                *v = (*b as f64 + a * (*v as f64 - *b as f64)) as f32;
            }
        }
        x
    });
    let (name, _, sig, ev, detail) = origin(&d, &c, &run);
    assert_eq!(name, "audio.encoder.memory");
    assert_eq!(sig, "row_affine", "{detail}");
    assert_eq!(ev["centred"], true, "{detail}");
    assert!(
        (ev["a_median"].as_f64().unwrap() - a).abs() < 1e-4,
        "{detail}"
    );
    assert!(
        ev["hint"].as_str().unwrap().contains("unbiased"),
        "{detail}"
    );
}
