//! `xray check --reference-variant SCHEME` on whisper-rand-a: the oracle also runs the HF model
//! with its weights on the scheme's grid and the evidence measures X-Ray's f32 runtime against
//! both references. A clean f32 runtime sits at the f32 reference and far from the int8 variant
//! (nothing is explained, nothing is "consistent"); stats-only refuses the option.

use crate::common;
use common::{FOX, RAND};

use common::{assert_refused, assert_schema_valid, check, on, ready};

#[test]
fn clean_runtime_is_at_the_reference_not_at_the_int8_variant() {
    if !ready(&[RAND]) {
        return;
    }
    let e = check(RAND, FOX, &["--reference-variant", "int8", "--no-drill"], 0);
    assert_schema_valid(&e);
    let v = &e["reference_variants"][0];
    assert_eq!(v["scheme"], "int8");
    assert!(
        v["origin"].is_null() && v["explained_failing"].is_null(),
        "{v:#}"
    );
    assert_eq!(v["consistent_failing"], serde_json::json!([0, 0]));
    let cps = v["checkpoints"].as_array().unwrap();
    let mem = cps
        .iter()
        .find(|c| c["name"] == "audio.encoder.memory")
        .expect("the memory is measured against the variant");
    let (er, ev, vr) = (
        mem["engine_vs_reference"].as_f64().unwrap(),
        mem["engine_vs_variant"].as_f64().unwrap(),
        mem["variant_vs_reference"].as_f64().unwrap(),
    );
    // f32 noise against the reference; the int8 grid's own departure against the variant.
    assert!(
        er < 1e-4 && ev > 1e-3 && (ev - vr).abs() < 0.1 * vr,
        "{mem:#}"
    );
    assert!(mem["explained"].as_f64().unwrap() < 0.0, "{mem:#}");
    assert!(e["notes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n.as_str().unwrap().starts_with("int8 reference variant:")));
}

#[test]
fn stats_only_refuses_a_reference_variant() {
    if !ready(&[RAND]) {
        return;
    }
    let o = on(
        "check",
        RAND,
        FOX,
        &["--stats-only", "--reference-variant", "int8"],
    );
    assert_refused(&o, "--reference-variant");
}
