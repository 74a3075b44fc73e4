//! Graph validation fails closed with the exact edge in the message: layout (no declared
//! transform), shape, missing weight; and the real Whisper graph exports its edges and labels.

mod whisper_support;

use std::collections::HashMap;

use xray_core::testing::strs;
use xray_runtime::graph::{GraphBuilder, Layout};
use xray_runtime::kernels::{Attention, Linear, MatmulStrategy, SplitHeads};
use xray_runtime::weights::Weights;
use xray_runtime::{shape, RuntimeError};

/// memory [S, 8] -> cross_k_proj (token-major) -> ? -> cross_attn (head-major k port).
fn cross_graph(with_transform: bool) -> Result<xray_runtime::Graph, RuntimeError> {
    let mut g = GraphBuilder::new("toy");
    let q = g.feed("q", shape![2, "tokens", 4], Layout::HeadMajor)?;
    let v = g.feed("v", shape![2, 6, 4], Layout::HeadMajor)?;
    let mem = g.feed("memory", shape![6, 8], Layout::TokenMajor)?;
    let k = g.op1(
        "cross_k_proj",
        Box::new(Linear::new(false, MatmulStrategy::Gemm)),
        &[mem],
        &[("k_proj.weight", vec![8, 8])],
        shape![6, 8],
        Layout::TokenMajor,
    )?;
    let (k, kshape) = if with_transform {
        let k = g.op1(
            "cross_k_to_head_major",
            Box::new(SplitHeads { heads: 2 }),
            &[k],
            &[],
            shape![2, 6, 4],
            Layout::HeadMajor,
        )?;
        (k, shape![2, "tokens", 4])
    } else {
        (k, shape![2, "tokens", 4])
    };
    let y = g.op1(
        "cross_attn",
        Box::new(Attention::new(0.5, false, MatmulStrategy::RowStable)),
        &[q, k, v],
        &[],
        kshape,
        Layout::HeadMajor,
    )?;
    g.output(y);
    g.build()
}

#[test]
fn token_major_into_head_major_port_names_both_endpoints() {
    let e = cross_graph(false).unwrap_err();
    assert!(matches!(e, RuntimeError::LayoutMismatch { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("cross_k_proj:y/token_major -> cross_attn:k/head_major"),
        "{msg}"
    );
    assert!(msg.contains("edge 'cross_k_proj.y'"), "{msg}");
    // Declaring the transform makes the same wiring valid.
    cross_graph(true).expect("with the declared transform the graph builds");
}

#[test]
fn shape_mismatch_names_the_edge_and_both_shapes() {
    let mut g = GraphBuilder::new("toy");
    let x = g
        .feed("x", shape!["tokens", 8], Layout::TokenMajor)
        .unwrap();
    // fc1 maps 8 -> 16 features, but the edge is declared with 12.
    let y = g
        .op1(
            "fc1",
            Box::new(Linear::new(true, MatmulStrategy::RowStable)),
            &[x],
            &[("fc1.weight", vec![16, 8]), ("fc1.bias", vec![16])],
            shape!["tokens", 12],
            Layout::TokenMajor,
        )
        .unwrap();
    g.output(y);
    let e = g.build().unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, RuntimeError::ShapeMismatch { .. }), "{e:?}");
    assert!(
        msg.contains("'fc1.y'") && msg.contains("[tokens, 12]") && msg.contains("[tokens, 16]"),
        "{msg}"
    );
}

#[test]
fn missing_and_mismatched_and_unused_weights_name_the_key_and_file() {
    let g = cross_graph(true).unwrap();
    let w = Weights::from_map("toy/model.safetensors", HashMap::new());
    let msg = g.check_weights(&w).unwrap_err().to_string();
    assert!(
        msg.contains("'k_proj.weight'")
            && msg.contains("toy/model.safetensors")
            && msg.contains("cross_k_proj"),
        "{msg}"
    );

    let w = Weights::from_map(
        "toy/model.safetensors",
        HashMap::from([(
            "k_proj.weight".to_string(),
            ndarray::ArrayD::zeros(vec![8, 4]),
        )]),
    );
    let msg = g.check_weights(&w).unwrap_err().to_string();
    assert!(
        msg.contains("'k_proj.weight'") && msg.contains("[8, 4]") && msg.contains("[8, 8]"),
        "{msg}"
    );

    let w = Weights::from_map(
        "toy/model.safetensors",
        HashMap::from([
            (
                "k_proj.weight".to_string(),
                ndarray::ArrayD::zeros(vec![8, 8]),
            ),
            ("stray.weight".to_string(), ndarray::ArrayD::zeros(vec![1])),
        ]),
    );
    let msg = g.check_weights(&w).unwrap_err().to_string();
    assert!(msg.contains("stray.weight"), "{msg}");
}

/// The random-init Whisper fixture's model, when it is built.
fn rand_a() -> Option<xray_runtime::models::whisper::WhisperModel> {
    let dir = whisper_support::fixture("fixtures/build/whisper-rand-a")?;
    Some(xray_runtime::models::whisper::WhisperModel::load(&dir).expect("load"))
}

#[test]
fn whisper_graph_exports_edges_layouts_and_contract_labels() {
    let Some(m) = rand_a() else {
        return;
    };
    let g = xray_runtime::models::SpeechModel::graph(&m);
    let j = g.to_json();
    let cps = j["checkpoints"].as_object().expect("checkpoints");
    assert_eq!(
        cps["audio.decoder.layer.1.cross_k"],
        "decoder.layer.1.cross_k"
    );
    assert_eq!(cps["audio.decoder.logits"], "decoder.logits");
    let edges = j["edges"].as_array().expect("edges");
    let ck = edges
        .iter()
        .find(|e| e["name"] == "decoder.layer.0.cross_k")
        .expect("cross_k edge");
    assert_eq!(ck["layout"], "head_major");
    assert_eq!(
        ck["producer"]["op"],
        "decoder.layer.0.cross_k_to_head_major"
    );
    assert_eq!(ck["shape"], serde_json::json!(["4", "250", "16"]));
    let consumers: Vec<&str> = strs(&ck["consumers"], "op");
    assert_eq!(consumers, ["decoder.layer.0.cross_attn"]);
    // Encoder memory: one producer, every decoder layer's cross K and V projection consumes it.
    let mem = edges
        .iter()
        .find(|e| e["name"] == "encoder.memory")
        .expect("memory edge");
    assert_eq!(mem["consumers"].as_array().unwrap().len(), 2 * 2);
    // The self-attention cache is a feed in and an output out; no op holds it.
    assert!(edges
        .iter()
        .any(|e| e["name"] == "decoder.layer.1.self_k_past" && e["producer"].is_null()));
    assert!(j["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .any(|o| o == "decoder.layer.1.self_k"));
}

/// `x -> a -> b`, two linears; `bias_key` is `a`'s bias key, `c` another op reading `c_weight`.
fn point_graph(
    bias_key: &str,
    c_weight: Option<&str>,
) -> Result<xray_runtime::Graph, RuntimeError> {
    let mut g = GraphBuilder::new("toy");
    let x = g.feed("x", shape!["tokens", 4], Layout::TokenMajor)?;
    let lin = |bias| Box::new(Linear::new(bias, MatmulStrategy::Gemm));
    let y1 = g.op1(
        "a",
        lin(true),
        &[x],
        &[("m.a.weight", vec![4, 4]), (bias_key, vec![4])],
        shape!["tokens", 4],
        Layout::TokenMajor,
    )?;
    let y2 = g.op1(
        "b",
        lin(false),
        &[y1],
        &[("m.b.weight", vec![4, 4])],
        shape!["tokens", 4],
        Layout::TokenMajor,
    )?;
    g.output(y2);
    if let Some(w) = c_weight {
        let y3 = g.op1(
            "c",
            lin(false),
            &[y2],
            &[(w, vec![4, 4])],
            shape!["tokens", 4],
            Layout::TokenMajor,
        )?;
        g.output(y3);
    }
    g.build()
}

/// Op-level points follow the weight keys: `a`'s output is `m.a:out` and `m.b:in` (one tensor,
/// two names), the point graph links `m.b:out` to it through op `b` alone; a module two ops read
/// names no point; an op reading two modules' weights is refused, naming it.
#[test]
fn op_level_points_follow_the_weight_keys() {
    let g = point_graph("m.a.bias", None).unwrap();
    let pts: HashMap<String, String> = g
        .point_edges()
        .into_iter()
        .map(|(p, e)| (p, g.edges()[e].name.clone()))
        .collect();
    assert_eq!(pts["m.a:in"], "x");
    assert_eq!(pts["m.a:out"], pts["m.b:in"]);
    let nodes = g.point_nodes();
    let out_b = nodes.iter().position(|n| n.names == ["m.b:out"]).unwrap();
    let ins: Vec<&Vec<String>> = nodes[out_b]
        .inputs
        .iter()
        .map(|&i| &nodes[i].names)
        .collect();
    assert_eq!(ins, [&vec!["m.a:out".to_string(), "m.b:in".to_string()]]);
    assert_eq!(nodes[out_b].ops, ["b"]);

    let shared = point_graph("m.a.bias", Some("m.b.weight")).unwrap();
    let names: Vec<String> = shared.point_edges().into_iter().map(|(p, _)| p).collect();
    assert!(names.iter().all(|p| !p.starts_with("m.b:")), "{names:?}");
    assert!(names.contains(&"m.a:out".to_string()), "{names:?}");

    let err = point_graph("m.z.bias", None).unwrap_err().to_string();
    assert!(err.contains("op 'a'") && err.contains("m.z"), "{err}");
}

/// `Graph::reached_from` follows the edges forward from the declared ops: their own outputs and
/// everything downstream, each named with the first declared op it depends on; what is upstream
/// or beside them is not reached; an unknown op is an error naming it.
#[test]
fn reached_from_follows_the_edges_downstream_of_the_declared_ops() {
    let g = cross_graph(true).unwrap();
    let r = g.reached_from(&["cross_k_to_head_major"]).unwrap();
    let names: Vec<&str> = r.iter().map(|(n, _)| n.as_str()).collect();
    assert!(
        r.iter().all(|(_, op)| op == "cross_k_to_head_major"),
        "{r:?}"
    );
    // The toy graph labels no checkpoint and mirrors no HF module: nothing to name.
    assert!(names.is_empty(), "{names:?}");
    let e = g.reached_from(&["no_such_op"]).unwrap_err().to_string();
    assert!(e.contains("'no_such_op' is no op of the toy graph"), "{e}");

    let Some(dir) = whisper_support::fixture("fixtures/whisper-tiny-en") else {
        return;
    };
    let m = xray_runtime::models::load(&dir).expect("load");
    let g = xray_runtime::models::SpeechModel::graph(m.as_ref());
    let r = g
        .reached_from(&["encoder.layer.1.gelu", "encoder.layer.2.fc1"])
        .unwrap();
    let by = |n: &str| r.iter().find(|(x, _)| x == n).map(|(_, op)| op.as_str());
    assert_eq!(
        by("audio.encoder.layer.1.out"),
        Some("encoder.layer.1.gelu")
    );
    // Downstream of both: the first in graph order.
    assert_eq!(
        by("audio.encoder.layer.2.out"),
        Some("encoder.layer.1.gelu")
    );
    assert_eq!(by("audio.encoder.memory"), Some("encoder.layer.1.gelu"));
    assert_eq!(by("audio.decoder.logits"), Some("encoder.layer.1.gelu"));
    assert_eq!(
        by("model.encoder.layers.1.fc2:in"),
        Some("encoder.layer.1.gelu")
    );
    // Upstream and beside: not reached.
    for n in [
        "audio.frontend.mel",
        "audio.encoder.layer.0.out",
        "model.encoder.layers.1.fc1:out",
        "audio.decoder.input_ids",
    ] {
        assert_eq!(by(n), None, "{n}");
    }
}

/// `ops_between` on the real graph: the self-attention probabilities at a decode step, bounded by
/// their checkpoint inputs (the origin's own name among them: the contract's `@previous` cache
/// stand-in), then by agreeing op-level points, one of them downstream of the attention (its
/// context agrees while its probabilities do not: K and V appended in the same wrong order). Only
/// names upstream of the origin clear ops, and the origin's own name clears nothing.
#[test]
fn ops_between_clears_only_with_names_upstream_of_the_origin() {
    let Some(m) = rand_a() else {
        return;
    };
    let g = xray_runtime::models::SpeechModel::graph(&m);
    let to = "audio.decoder.layer.0.self_attention.probs";
    let ids = ["audio.decoder.input_ids", "audio.decoder.position_ids"];
    let base = g.ops_between(&ids, to).unwrap();
    let with_self = g.ops_between(&[ids[0], ids[1], to], to).unwrap();
    assert_eq!(with_self, base);
    for op in [
        "decoder.embed_tokens",
        "decoder.layer.0.self_k_proj",
        "decoder.layer.0.self_k_append",
        "decoder.layer.0.self_v_append",
        "decoder.layer.0.self_attn",
    ] {
        assert!(base.iter().any(|o| o == op), "{op} not in {base:?}");
    }
    let p = |m: &str| format!("model.decoder.layers.0.self_attn.{m}");
    let points = [
        p("q_proj:out"),
        p("k_proj:out"),
        p("v_proj:out"),
        p("out_proj:in"),
    ];
    let mut good: Vec<&str> = ids.to_vec();
    good.extend(points.iter().map(String::as_str));
    let left = g.ops_between(&good, to).unwrap();
    assert_eq!(
        left,
        [
            "decoder.layer.0.self_q_to_head_major",
            "decoder.layer.0.self_k_to_head_major",
            "decoder.layer.0.self_v_to_head_major",
            "decoder.layer.0.self_k_append",
            "decoder.layer.0.self_v_append",
            "decoder.layer.0.self_attn",
        ]
    );
}
