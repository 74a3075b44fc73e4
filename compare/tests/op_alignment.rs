//! Op-level points are aligned by declaration: a shared point whose shapes still differ is an
//! alignment fault, reported by `compare_points`, and the op-level localization never names an op
//! on its strength (it goes on to the next point, and does not clear an op whose input point is
//! misaligned).

use ndarray::{ArrayD, Dimension, IxDyn};
use xray_compare::localize::Status;
use xray_compare::ops::{compare_points, localize_op};
use xray_compare::tolerance::Policy;
use xray_core::dump::{Dump, DumpWriter, Manifest};
use xray_core::ops::{chain, PointNode};
use xray_core::Layout;

fn manifest(producer: &str) -> Manifest {
    Manifest {
        weights_sha256: "ab".repeat(32),
        audio_sha256: "cd".repeat(32),
        ..Manifest::empty("whisper", "m", producer)
    }
}

fn t(shape: &[usize], seed: f32) -> ArrayD<f32> {
    ArrayD::from_shape_fn(IxDyn(shape), |i| {
        let k: usize = i.slice().iter().fold(0, |a, &x| a * 7 + x);
        ((k as f32) * 0.37 + seed).sin()
    })
}

fn dump(dir: &std::path::Path, producer: &str, points: &[(&str, ArrayD<f32>)]) -> Dump {
    let mut w = DumpWriter::new(manifest(producer));
    for (name, a) in points {
        w.add(name, 0, Layout::TokenMajor, a);
    }
    w.write(dir).unwrap();
    Dump::load(dir).unwrap()
}

/// The reference pads `q:in` to 6 rows, the engine holds 4: an alignment fault, not a
/// divergence; `q:out` (which does differ) is the op-level origin, and since its input point was
/// not aligned, its op is not named alone.
#[test]
fn a_misaligned_point_is_a_fault_and_never_the_origin() {
    let dir = tempfile::tempdir().unwrap();
    let good = t(&[4, 3], 0.0);
    let out = t(&[4, 5], 1.0);
    let mut bad_out = out.clone();
    bad_out[[2, 1]] += 1.0;
    let r = dump(
        &dir.path().join("r"),
        "oracle",
        &[
            ("m.norm:out", good.clone()),
            ("m.q:in", t(&[6, 3], 0.0)),
            ("m.q:out", out.clone()),
            ("m.k:out", t(&[4, 2], 2.0)),
        ],
    );
    let x = dump(
        &dir.path().join("x"),
        "runtime",
        &[
            ("m.norm:out", good),
            ("m.q:in", t(&[4, 3], 0.0)),
            ("m.q:out", bad_out),
            ("m.k:out", t(&[4, 2], 2.0)),
        ],
    );
    let policy = Policy::default();
    let p = compare_points(&r, &x, &policy);
    assert_eq!(p.shared, 4, "{p:?}");
    assert_eq!(p.alignment_faults.len(), 1, "{p:?}");
    let a = &p.alignment_faults[0];
    assert_eq!((a.point.as_str(), a.step), ("m.q:in", 0));
    assert_eq!(a.reference.0, vec![6, 3]);
    assert_eq!(a.engine.0, vec![4, 3]);
    assert!(a.reason.contains("shapes differ"), "{}", a.reason);
    assert_eq!((p.compared, p.pass, p.failed_count), (3, 2, 1), "{p:?}");
    assert_eq!(p.failed, vec!["m.q:out@step0".to_string()]);
    assert!(p.summary().contains("1 alignment fault"), "{}", p.summary());

    // Localization through an engine graph: norm -> q:in (alias of norm:out's consumer) -> q:out.
    let nodes = vec![
        PointNode {
            names: vec!["m.norm:out".into()],
            inputs: vec![],
            ops: vec!["norm".into()],
        },
        PointNode {
            names: vec!["m.q:in".into()],
            inputs: vec![0],
            ops: vec!["pad".into()],
        },
        PointNode {
            names: vec!["m.q:out".into()],
            inputs: vec![1],
            ops: vec!["q".into()],
        },
    ];
    let op = localize_op(&nodes, &r, &x, 0, &policy, None).expect("q:out differs");
    assert_eq!(op.point, "m.q:out");
    assert_eq!(
        op.op, None,
        "an op whose input is misaligned is not named alone: {op:?}"
    );
    assert_eq!(op.suspects, vec!["q".to_string()]);
    assert_eq!(op.inputs[0].status, Status::AlignmentFault);
    assert!(op.summary().contains("not aligned"), "{}", op.summary());

    // Without an engine graph (the reference's firing order): the misaligned point is skipped.
    let names: Vec<String> = ["m.norm:out", "m.q:in", "m.q:out", "m.k:out"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let op = localize_op(&chain(&names), &r, &x, 0, &policy, None).expect("q:out differs");
    assert_eq!(op.point, "m.q:out");
    assert_ne!(op.point, "m.q:in");
}

/// Only a misaligned point differs: no op-level origin at all, and the fault is reported.
#[test]
fn an_alignment_fault_alone_names_no_op() {
    let dir = tempfile::tempdir().unwrap();
    let r = dump(
        &dir.path().join("r"),
        "oracle",
        &[("m.a:out", t(&[4, 3], 0.0)), ("m.b:in", t(&[3, 4], 0.0))],
    );
    let x = dump(
        &dir.path().join("x"),
        "runtime",
        &[("m.a:out", t(&[4, 3], 0.0)), ("m.b:in", t(&[4, 3], 0.0))],
    );
    let policy = Policy::default();
    let names = vec!["m.a:out".to_string(), "m.b:in".to_string()];
    assert_eq!(localize_op(&chain(&names), &r, &x, 0, &policy, None), None);
    let p = compare_points(&r, &x, &policy);
    assert_eq!((p.pass, p.alignment_faults.len()), (1, 1), "{p:?}");
}
