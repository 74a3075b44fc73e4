//! Localization on the real Whisper checkpoint contract (resolved by xray-core).

use crate::common;

use xray_compare::localize::{localize, Observed, Status};

#[test]
fn whisper_contract_expands_into_a_step_major_dag() {
    let g = common::whisper_graph(4, 4, &[0, 1, 2]);
    // Step 0: mel, conv1, conv2, 4 encoder layers, memory, the fed ids and positions, 4 x 7
    // decoder, logits; later steps 2 + 4 x 5 + 1 (no cross K/V: the projection cache is made
    // once, at prefill).
    assert_eq!(g.len(), (3 + 4 + 1 + 2 + 28 + 1) + 2 * (2 + 20 + 1));
    assert!(g.nodes().windows(2).all(|w| w[0].step <= w[1].step));
    let ids = |i: usize| -> Vec<String> {
        g.nodes()[i]
            .upstream
            .iter()
            .map(|&u| g.nodes()[u].id())
            .collect()
    };
    let mem = g.find("audio.encoder.memory", 0).unwrap();
    assert_eq!(ids(mem), ["audio.encoder.layer.3.out@step0"]);
    // Fan-out: the encoder memory feeds every decoder layer's cross K and V.
    assert_eq!(g.nodes()[mem].downstream.len(), 8);
    let ca = g
        .find("audio.decoder.layer.2.cross_attention.output", 2)
        .unwrap();
    let ups = ids(ca);
    for want in [
        "audio.decoder.layer.2.self_attention.output@step2",
        "audio.decoder.layer.2.cross_k@step0",
        "audio.decoder.layer.2.cross_v@step0",
    ] {
        assert!(ups.iter().any(|u| u == want), "{want} not in {ups:?}");
    }
    let sa = g
        .find("audio.decoder.layer.0.self_attention.output", 1)
        .unwrap();
    assert_eq!(
        ids(sa),
        [
            "audio.decoder.input_ids@step1",
            "audio.decoder.position_ids@step1",
            "audio.decoder.layer.0.self_attention.probs@step1",
            "audio.decoder.layer.0.self_attention.output@step0"
        ]
    );
    // The attention probabilities at a decode step hang off the previous layer at this step and
    // their own previous step (the self-attention cache is not a checkpoint).
    let p2 = g
        .find("audio.decoder.layer.2.self_attention.probs", 1)
        .unwrap();
    assert_eq!(
        ids(p2),
        [
            "audio.decoder.layer.1.out@step1",
            "audio.decoder.layer.2.self_attention.probs@step0"
        ]
    );
    let enc0 = g.find("audio.encoder.layer.0.out", 0).unwrap();
    assert_eq!(ids(enc0), ["audio.encoder.conv2.out@step0"]);
    // Layer-major order inside the decoder.
    let l0out = g.find("audio.decoder.layer.0.out", 0).unwrap();
    let l1sa = g
        .find("audio.decoder.layer.1.self_attention.output", 0)
        .unwrap();
    assert!(l0out < l1sa);
}

#[test]
fn a_fault_planted_anywhere_is_located_by_the_graph() {
    let g = common::whisper_graph(2, 2, &[0, 1, 2]);
    // Plant a fault at every node in turn: mark it and everything reachable from it failing.
    for planted in 0..g.len() {
        let mut bad = vec![false; g.len()];
        bad[planted] = true;
        for i in planted + 1..g.len() {
            bad[i] = g.nodes()[i].upstream.iter().any(|&u| bad[u]);
        }
        let obs: Vec<Observed> = bad
            .iter()
            .map(|&b| if b { Observed::Fail } else { Observed::Pass })
            .collect();
        let l = localize(&g, &obs).unwrap();
        assert_eq!(
            l.origin,
            Some(planted),
            "planted at {}",
            g.nodes()[planted].id()
        );
        assert!(l
            .status
            .iter()
            .enumerate()
            .all(|(i, s)| (i == planted) == (*s == Status::Origin)));
        assert!(!l.status.contains(&Status::Fail));
    }
}

#[test]
fn synthetic_cache_layout_fault_is_explained() {
    let e = common::whisper_evidence(true);
    let fd = e.first_divergence.as_ref().unwrap();
    assert_eq!(
        (fd.checkpoint.as_str(), fd.step),
        ("audio.decoder.layer.1.cross_k", 0)
    );
    assert_eq!(fd.producer, "decoder.layer.1.cross_k_to_head_major");
    assert!(fd.inputs.iter().all(|i| i.status == Status::Pass));
    let x = fd.explanation.as_ref().unwrap();
    assert_eq!(x.signature.as_str(), "permutation");
    assert_eq!(x.evidence["axes"], serde_json::json!([1, 0, 2]));
    let d = e.drill_down.as_ref().unwrap();
    assert_eq!(
        d.cause_up_to_step.as_deref(),
        Some("audio.decoder.layer.1.cross_k@step0")
    );
}
