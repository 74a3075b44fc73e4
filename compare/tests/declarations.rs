//! Entry declarations through the whole pipeline on a real reference dump (the committed HF oracle
//! dump of whisper-rand-a on fox.wav): an engine that returns step 0's last row only
//! (`token_positions: last`) and logits after suppression (`logits_processed: suppression`) is
//! compared for what it is, undeclared suppression is named as a mechanism, and what cannot be
//! honoured is refused naming it.

mod common;

use std::path::PathBuf;

use common::assert_explained;
use ndarray::{ArrayD, Axis, Slice};
use xray_compare::compare::compare_dumps_isolated;
use xray_compare::compare::CompareOptions;
use xray_compare::localize::Status;
use xray_compare::suppression::Suppression;
use xray_core::contract::Contract;
use xray_core::dump::{Dump, LogitsProcessed, TokenPositions};

const LOGITS: &str = "audio.decoder.logits";

fn reference() -> (Dump, Contract) {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/dumps/whisper-rand-a.fox");
    let d = Dump::load(&dir).expect("committed reference dump");
    let config = d.manifest.extra.get("config").cloned().unwrap();
    let c = Contract::for_family("whisper", &config).expect("whisper contract");
    (d, c)
}

fn suppression() -> Suppression {
    Suppression {
        every: vec![1, 2, 7, 50257],
        begin: vec![220, 50256],
        source: "test lists".into(),
    }
}

/// The engine: the reference's tensors, step 0's logits cut to the last row, every step's
/// suppressed ids set to f32::MIN (as CTranslate2 writes them); `declare` says so per entry.
fn engine(d: &Dump, declare_rows: bool, declare_processed: bool) -> Dump {
    let mut e = d.clone();
    e.manifest.producer = "engine".into();
    let sup = suppression();
    for entry in e.manifest.checkpoints.iter_mut() {
        if entry.name != LOGITS {
            continue;
        }
        let mut t: ArrayD<f32> = d.get(LOGITS, entry.step).unwrap().clone();
        if entry.step == 0 {
            let n = t.shape()[0];
            t = t.slice_axis(Axis(0), Slice::from(n - 1..n)).to_owned();
            entry.shape = t.shape().to_vec();
            entry.token_positions = declare_rows.then_some(TokenPositions::Last);
        }
        for mut row in t.lanes_mut(Axis(1)) {
            for i in sup.ids_at(entry.step) {
                row[i] = f32::MIN;
            }
        }
        entry.logits_processed = declare_processed.then_some(LogitsProcessed::Suppression);
        e.tensors.insert((LOGITS.into(), entry.step), t);
    }
    e
}

fn opts(sup: Option<Suppression>) -> CompareOptions {
    CompareOptions {
        suppression: sup,
        ..Default::default()
    }
}

#[test]
fn declared_last_row_and_suppression_pass() {
    let (d, c) = reference();
    let e = engine(&d, true, true);
    let (cmp, _, _, notes) =
        compare_dumps_isolated(&c, &d, &e, vec![], &opts(Some(suppression()))).unwrap();
    let logits: Vec<_> = cmp
        .checkpoints
        .iter()
        .filter(|x| x.name == LOGITS)
        .collect();
    assert_eq!(logits.len(), 3);
    assert!(
        logits.iter().all(|x| x.status == Status::Pass),
        "{logits:#?}"
    );
    assert_eq!(logits[0].shape, vec![1, 51864]); // step 0: the reference's last row
    assert!(cmp.first_divergence.is_none());
    assert!(
        notes
            .iter()
            .any(|n| n.contains("logits processed: suppression (declared)")
                && n.contains("at 14 of 14 in")), // 6 ids at step 0, 4 at steps 1 and 2
        "{notes:?}"
    );
}

#[test]
fn a_real_difference_outside_the_suppressed_ids_still_fails() {
    let (d, c) = reference();
    let mut e = engine(&d, true, true);
    let t = e.tensors.get_mut(&(LOGITS.to_string(), 1)).unwrap();
    t[[0, 100]] += 5.0;
    let (cmp, ..) = compare_dumps_isolated(&c, &d, &e, vec![], &opts(Some(suppression()))).unwrap();
    let fd = cmp.first_divergence.expect("an origin");
    assert_eq!((fd.checkpoint.as_str(), fd.step), (LOGITS, 1));
}

#[test]
fn undeclared_suppression_is_named_and_fails() {
    let (d, c) = reference();
    let e = engine(&d, true, false);
    let (cmp, ..) = compare_dumps_isolated(&c, &d, &e, vec![], &opts(Some(suppression()))).unwrap();
    let fd = cmp.first_divergence.expect("undeclared suppression fails");
    assert_explained(
        &fd.explanation.unwrap(),
        xray_core::SignatureKind::LogitsProcessed,
        &[
            "the 6 of 51864 ids",
            "exactly the ids test lists suppresses at step 0",
        ],
    );
}

#[test]
fn begin_suppression_at_a_later_step_is_named() {
    let (d, c) = reference();
    let mut e = engine(&d, true, true);
    let t = e.tensors.get_mut(&(LOGITS.to_string(), 2)).unwrap();
    t[[0, 220]] = f32::MIN;
    t[[0, 50256]] = f32::MIN;
    let (cmp, ..) = compare_dumps_isolated(&c, &d, &e, vec![], &opts(Some(suppression()))).unwrap();
    let fd = cmp.first_divergence.expect("an origin");
    assert_eq!(fd.step, 2);
    assert_explained(
        &fd.explanation.unwrap(),
        xray_core::SignatureKind::LogitsProcessed,
        &["220, 50256", "begin_suppress_tokens"],
    );
}

#[test]
fn undeclared_last_row_is_a_shape_fault_that_says_how_to_declare_it() {
    let (d, c) = reference();
    let e = engine(&d, false, true);
    let (cmp, ..) = compare_dumps_isolated(&c, &d, &e, vec![], &opts(Some(suppression()))).unwrap();
    let fd = cmp.first_divergence.unwrap();
    assert_eq!((fd.checkpoint.as_str(), fd.step), (LOGITS, 0));
    assert!(fd.explanation.unwrap().detail.contains("token_positions"));
}

#[test]
fn what_cannot_be_honoured_is_refused_naming_it() {
    let (d, c) = reference();
    // Suppression declared, but no suppress list known.
    let e = engine(&d, true, true);
    let err = compare_dumps_isolated(&c, &d, &e, vec![], &opts(None))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("audio.decoder.logits@step0") && err.contains("extra.generation_config"),
        "{err}"
    );
    // token_positions on a checkpoint without a tokens axis.
    let mut e = d.clone();
    for entry in e.manifest.checkpoints.iter_mut() {
        if entry.name == "audio.encoder.memory" {
            entry.token_positions = Some(TokenPositions::Last);
        }
    }
    let err = compare_dumps_isolated(&c, &d, &e, vec![], &opts(None))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no 'tokens' axis"), "{err}");
    // logits_processed on a checkpoint that is not logits.
    let mut e = d.clone();
    for entry in e.manifest.checkpoints.iter_mut() {
        if entry.name == "audio.encoder.memory" {
            entry.logits_processed = Some(LogitsProcessed::Suppression);
        }
    }
    let err = compare_dumps_isolated(&c, &d, &e, vec![], &opts(Some(suppression())))
        .unwrap_err()
        .to_string();
    assert!(err.contains("not logits"), "{err}");
    // extra.fed's from must be text.
    let mut e = d.clone();
    e.manifest.extra.insert(
        "fed".into(),
        serde_json::json!({"audio.encoder.memory": {"from": 3, "into": "x"}}),
    );
    let err = compare_dumps_isolated(&c, &d, &e, vec![], &opts(None))
        .unwrap_err()
        .to_string();
    assert!(err.contains("extra.fed.audio.encoder.memory.from"), "{err}");
}
