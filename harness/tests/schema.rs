//! Produced evidence validates against docs/evidence.schema.json.

mod common;

use std::path::PathBuf;

use serde_json::Value;

fn validator() -> jsonschema::Validator {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/evidence.schema.json");
    let text = std::fs::read_to_string(&p).expect("schema file");
    let schema: Value = serde_json::from_str(&text).expect("schema JSON");
    jsonschema::validator_for(&schema).expect("valid JSON Schema")
}

fn assert_valid(v: &Value) {
    let val = validator();
    let errors: Vec<String> = val
        .iter_errors(v)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "schema errors: {errors:#?}");
}

#[test]
fn diverged_whisper_evidence_is_valid() {
    let e = common::whisper_evidence(true);
    assert!(e.first_divergence.is_some() && e.drill_down.is_some());
    assert_valid(&serde_json::to_value(&e).unwrap());
}

#[test]
fn passing_whisper_evidence_is_valid() {
    let e = common::whisper_evidence(false);
    assert_eq!(
        e.verdict,
        xray_compare::evidence::Verdict::Pass,
        "{:#?}",
        e.checkpoints
            .iter()
            .filter(|c| c.status != xray_compare::localize::Status::Pass)
            .collect::<Vec<_>>()
    );
    assert_valid(&serde_json::to_value(&e).unwrap());
}

#[test]
fn tiny_evidence_round_trips_and_is_valid() {
    let e = common::tiny_evidence();
    let text = e.to_json().unwrap();
    let back = xray_compare::evidence::Evidence::from_json(&text, "mem").unwrap();
    assert_eq!(back, e);
    assert_valid(&serde_json::from_str(&text).unwrap());
}

#[test]
fn schema_rejects_drift() {
    let mut v = serde_json::to_value(common::tiny_evidence()).unwrap();
    v["checkpoints"][0]["status"] = Value::from("weird");
    assert!(!validator().is_valid(&v));
    let mut v = serde_json::to_value(common::tiny_evidence()).unwrap();
    v["unexpected"] = Value::from(1);
    assert!(!validator().is_valid(&v));
}
