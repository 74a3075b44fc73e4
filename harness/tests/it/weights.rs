//! `xray weights`: real tiny.en weights against a copy with converter bugs planted, tensor by
//! tensor, each named with its signature.

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use serde_json::Value;
use xray_runtime::weights::Weights;

use crate::common::{self, TINY};

/// Writes `tensors` as an f32 safetensors file.
fn write(path: &Path, tensors: &BTreeMap<String, xray_core::Tensor>) {
    let bytes: BTreeMap<&str, (Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(k, t)| {
            let b = t.iter().flat_map(|v| v.to_le_bytes()).collect();
            (k.as_str(), (t.shape().to_vec(), b))
        })
        .collect();
    let views: Vec<(&str, TensorView<'_>)> = bytes
        .iter()
        .map(|(k, (s, b))| (*k, TensorView::new(Dtype::F32, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn weights(args: &[&str]) -> (std::process::Output, Option<Value>) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("w.json");
    let o = common::xray(&[&["weights"], args, &["--json", json.to_str().unwrap()]].concat());
    let v = std::fs::read_to_string(&json)
        .ok()
        .map(|t| serde_json::from_str(&t).unwrap());
    (o, v)
}

/// A transposed square weight, K read from V's tensor, a weight truncated to bf16 and a dropped
/// bias: each named (`permutation`, `wiring` naming the V tensor, `rounding`, only in the
/// reference), exit 1; the same table written again: exit 0.
#[test]
fn planted_converter_bugs_are_named_tensor_by_tensor() {
    let Some(dir) = common::ready_tempdir(&[TINY]) else {
        return;
    };
    let model = common::root().join(TINY);
    let w = Weights::load(&model.join("model.safetensors")).unwrap();
    let mut t: BTreeMap<String, xray_core::Tensor> = w
        .keys()
        .map(|k| (k.to_string(), w.get(k).unwrap().clone()))
        .collect();
    let same = dir.path().join("same.safetensors");
    write(&same, &t);
    let (o, v) = weights(&[model.to_str().unwrap(), same.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    assert_eq!(v.unwrap()["differs"], serde_json::json!([]));

    let out = "model.encoder.layers.1.self_attn.out_proj.weight";
    let tr = t[out].t().as_standard_layout().into_owned().into_dyn();
    t.insert(out.into(), tr);
    let (k, vv) = (
        "model.decoder.layers.1.encoder_attn.k_proj.weight",
        "model.decoder.layers.1.encoder_attn.v_proj.weight",
    );
    let v_t = t[vv].clone();
    t.insert(k.into(), v_t);
    let fc1 = "model.encoder.layers.2.fc1.weight";
    let cut = t[fc1].mapv(|x| f32::from_bits(x.to_bits() & 0xFFFF_0000));
    t.insert(fc1.into(), cut);
    let bias = "model.encoder.layers.3.fc2.bias";
    t.remove(bias);
    let bugged = dir.path().join("bugged.safetensors");
    write(&bugged, &t);
    let (o, v) = weights(&[model.to_str().unwrap(), bugged.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", common::stderr(&o));
    let v = v.unwrap();
    let sig = |key: &str| {
        v["differs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["key"] == key)
            .map(|d| {
                (
                    d["signature"].clone(),
                    d["detail"].as_str().unwrap().to_string(),
                )
            })
            .unwrap_or_else(|| panic!("{key} not among {}", v["differs"]))
    };
    assert_eq!(v["differs"].as_array().unwrap().len(), 3, "{v}");
    assert_eq!(sig(out).0, "permutation", "{:?}", sig(out));
    let (s, detail) = sig(k);
    assert_eq!(s, "wiring", "{detail}");
    assert!(detail.contains(vv), "{detail}");
    assert_eq!(sig(fc1).0, "rounding", "{:?}", sig(fc1));
    assert_eq!(v["only_reference"], serde_json::json!([bias]));
    let err = common::stderr(&o);
    assert!(err.contains("not the same"), "{err}");
}
