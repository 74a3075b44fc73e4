//! Produced evidence validates against docs/evidence.schema.json.

use crate::common;

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

/// A converted engine's `run.engine_weights`, a `reference_variants` entry and the
/// `logits_processed` signature validate (and round-trip); an engine_weights without its sha256
/// does not.
#[test]
fn engine_weights_and_reference_variants_are_valid() {
    use xray_compare::variant::{VariantCheckpoint, VariantEvidence};
    let mut e = common::whisper_evidence(true);
    e.run.engine_weights = Some(xray_core::dump::EngineWeights {
        format: "ctranslate2".into(),
        sha256: "1a".repeat(32),
        file: Some("model.bin".into()),
        source: Some("fixtures/whisper-tiny-en".into()),
        conversion: Some("exact f16 -> f32".into()),
        config: Some(serde_json::json!({"suppress_ids": [220]})),
    });
    let cp = VariantCheckpoint {
        name: "audio.encoder.memory".into(),
        step: 0,
        status: xray_compare::localize::Status::Origin,
        engine_vs_reference: 3.1e-2,
        engine_vs_variant: 2.4e-2,
        variant_vs_reference: 1.9e-2,
        explained: Some(0.42),
        consistent: false,
    };
    e.reference_variants.push(VariantEvidence {
        scheme: "int8".into(),
        description: "weights int8 per row".into(),
        dump: "ref-int8".into(),
        checkpoints: vec![cp.clone()],
        origin: Some(cp),
        explained_failing: Some(0.79),
        consistent_failing: (2, 5),
        summary: "int8 reference variant: ...".into(),
    });
    if let Some(x) = e
        .first_divergence
        .as_mut()
        .and_then(|f| f.explanation.as_mut())
    {
        x.signature = xray_core::SignatureKind::LogitsProcessed;
    }
    let text = e.to_json().unwrap();
    assert_eq!(
        xray_compare::evidence::Evidence::from_json(&text, "mem").unwrap(),
        e
    );
    let mut v: Value = serde_json::from_str(&text).unwrap();
    assert_valid(&v);
    v["run"]["engine_weights"]
        .as_object_mut()
        .unwrap()
        .remove("sha256");
    assert!(!validator().is_valid(&v));
}

/// `local_errors` (`xray compare --local-errors`) validates and round-trips; a convicted op
/// declared f32 makes the content's verdict `diverged` though every checkpoint passes, one
/// declared f16 that its precision replayed accounts for (or could not be replayed for) does
/// not, one that it does not account for does; an entry without its step is invalid.
#[test]
fn local_errors_are_valid_and_decide_the_verdict() {
    use xray_compare::evidence::Verdict;
    use xray_compare::mechanism::{
        DeclaredReplay, LocalError, LocalErrors, Mechanism, ReplayVerdict, SweptError,
    };
    use xray_core::replay::{Counterfactual, RoundFormat};
    let mut e = common::whisper_evidence(false);
    assert_eq!(e.derive_verdict(), Verdict::Pass);
    let swept = |declared: Option<&str>| SweptError {
        step: 0,
        declared: declared.map(String::from),
        local_error: LocalError {
            module: "model.encoder.layers.2.fc1".into(),
            op: Some("encoder.layer.2.fc1".into()),
            inputs: vec!["model.encoder.layers.2.fc1:in".into()],
            output: "model.encoder.layers.2.fc1:out".into(),
            rel_l2: Some(4.8e-4),
            max_abs: Some(2e-3),
            passes: false,
            verdict: ReplayVerdict::Convicted,
            shapes: None,
        },
        precision: declared.map(|_| DeclaredReplay {
            counterfactual: Counterfactual::ComputedIn {
                format: RoundFormat::F16,
            },
            residual: Some(1e-7),
            accounts: true,
            why: None,
        }),
        mechanism: declared.is_none().then(|| Mechanism {
            counterfactual: xray_core::replay::Counterfactual::WeightRounded {
                format: xray_core::replay::RoundFormat::Bf16,
            },
            residual: 9.5e-8,
            max_abs: 1e-6,
            clean_residual: Some(4.8e-4),
            hint: None,
            summary: "runtime == fc1 with its weight rounded to bf16".into(),
            also: vec![],
        }),
    };
    e.local_errors = Some(LocalErrors {
        replayed: 619,
        skipped: 0,
        convicted: vec![swept(Some("f16"))],
    });
    assert_eq!(e.derive_verdict(), Verdict::Pass);
    // Declared f16, and f16 not replayable there: excused, and said why.
    let l = e.local_errors.as_mut().unwrap();
    let p = l.convicted[0].precision.as_mut().unwrap();
    (p.residual, p.accounts, p.why) = (None, false, Some("does not apply".into()));
    assert_eq!(e.derive_verdict(), Verdict::Pass);
    // Declared f16, and f16 replayed does not reproduce it: an error of its own.
    let l = e.local_errors.as_mut().unwrap();
    let p = l.convicted[0].precision.as_mut().unwrap();
    (p.residual, p.accounts, p.why) = (Some(4.8e-4), false, None);
    assert_eq!(e.derive_verdict(), Verdict::Diverged);
    assert!(e.local_errors.as_ref().unwrap().summary().contains(
        "1 not, 0 not replayable); not accounted for: encoder.layer.2.fc1 (model.encoder.layers.2.fc1) rel_l2 4.8e-4 from step 0 (1 step, declared f16: computed in f16 leaves 4.8e-4)"
    ));
    let l = e.local_errors.as_mut().unwrap();
    l.convicted[0].precision.as_mut().unwrap().accounts = true;
    assert_eq!(e.derive_verdict(), Verdict::Pass);
    // Declared f16 and of another shape than the module's output: no precision excuses that.
    let l = e.local_errors.as_mut().unwrap();
    l.convicted[0].local_error.rel_l2 = None;
    assert_eq!(e.derive_verdict(), Verdict::Diverged);
    let l = e.local_errors.as_mut().unwrap();
    l.convicted[0].local_error.rel_l2 = Some(4.8e-4);
    e.local_errors.as_mut().unwrap().convicted.push(swept(None));
    assert_eq!(e.derive_verdict(), Verdict::Diverged);
    e.verdict = Verdict::Diverged;
    let text = e.to_json().unwrap();
    assert_eq!(
        xray_compare::evidence::Evidence::from_json(&text, "mem").unwrap(),
        e
    );
    let mut v: Value = serde_json::from_str(&text).unwrap();
    assert_valid(&v);
    // The content decides: a recorded pass over it is refused on read.
    v["verdict"] = Value::from("pass");
    assert!(xray_compare::evidence::Evidence::from_json(&v.to_string(), "mem").is_err());
    v["verdict"] = Value::from("diverged");
    v["local_errors"]["convicted"][1]
        .as_object_mut()
        .unwrap()
        .remove("step");
    assert!(!validator().is_valid(&v));
}

/// The counterfactuals solved on the clean replay (heads permuted, output shifted) validate
/// against the schema's `counterfactual`, and a field it does not declare does not.
#[test]
fn solved_counterfactuals_are_valid() {
    use xray_core::replay::Counterfactual;
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/evidence.schema.json");
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let sub = serde_json::json!({"$ref": "#/$defs/counterfactual", "$defs": schema["$defs"]});
    let v = jsonschema::validator_for(&sub).expect("valid JSON Schema");
    for cf in [
        Counterfactual::HeadsPermuted {
            slots: vec![1, 0, 2],
        },
        Counterfactual::OutputShifted { by: -1 },
        Counterfactual::FeaturesPermuted {
            slots: vec![0, 2, 1],
        },
        Counterfactual::KvSwapped,
        Counterfactual::KeysPadded { rows: 36 },
    ] {
        let j = serde_json::to_value(&cf).unwrap();
        assert!(v.is_valid(&j), "{j}");
    }
    assert!(!v.is_valid(&serde_json::json!({"kind": "heads_permuted", "heads": [1, 0]})));
}

/// Declared precision (`precision`, and the `precision:<dtype> via <op>` tolerance source) is
/// valid evidence, as an accept_precision policy applied to a dump declaring f16 ops writes it.
#[test]
fn declared_precision_is_valid() {
    use xray_compare::precision::{apply, DeclaredOp};
    use xray_compare::tolerance::{Policy, Precision};
    let mut e = common::tiny_evidence();
    let policy = Policy::from_json(
        r#"{"accept_precision": {"f16": {"default": {"atol": 1e-2, "rtol": 1e-2, "max_outlier_fraction": 1e-2}}}}"#,
    )
    .unwrap();
    let name = e.checkpoints[0].name.clone();
    let op = DeclaredOp {
        op: "encoder.conv1".into(),
        dtype: Precision::F16,
        why: "IM2COL to f16".into(),
    };
    let (policy, ev) = apply(
        policy,
        vec![op],
        vec![(name.clone(), "encoder.conv1".into())],
    );
    assert_eq!(ev.names_at_accepted_bounds, 1);
    let tol = policy.resolve(&name, 0, Precision::F32, None);
    e.checkpoints[0].tolerance = (&tol).into();
    e.precision = Some(ev);
    let v = serde_json::to_value(&e).unwrap();
    assert_eq!(
        v["checkpoints"][0]["tolerance"]["source"],
        "precision:f16 via encoder.conv1"
    );
    assert_valid(&v);
    let mut bad = v.clone();
    bad["precision"]["declared"][0]["dtype"] = Value::from("f32");
    assert!(!validator().is_valid(&bad));
}
