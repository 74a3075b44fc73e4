//! A NaN query must give NaN attention probabilities, as torch's softmax does (issue 10): the
//! runtime's exp used to clamp NaN to 88 and turn the row into finite probabilities.

use xray_runtime::graph::{Feeds, Out, RunCtx};
use xray_runtime::kernels::{Attention, MatmulStrategy};
use xray_runtime::weights::Weights;
use xray_runtime::{shape, GraphBuilder, Layout, Tensor};

/// Probabilities `[H, T, S]` of one attention op for q `[2, 3, 16]`, k and v `[2, 20, 16]`, with
/// q's element `(1, 1, 5)` set to NaN.
fn probs(strategy: MatmulStrategy, causal: bool) -> Tensor {
    let (h, t, s, d) = (2usize, 3usize, 20usize, 16usize);
    let mut g = GraphBuilder::new("toy");
    let q = g.feed("q", shape![h, t, d], Layout::HeadMajor).unwrap();
    let k = g.feed("k", shape![h, s, d], Layout::HeadMajor).unwrap();
    let v = g.feed("v", shape![h, s, d], Layout::HeadMajor).unwrap();
    let outs = g
        .op(
            "attn",
            Box::new(Attention {
                probs: true,
                ..Attention::new(0.25, causal, strategy)
            }),
            &[q, k, v],
            &[],
            vec![
                Out::new(shape![h, t, d], Layout::HeadMajor),
                Out::new(shape![h, t, s], Layout::HeadMajor),
            ],
        )
        .unwrap();
    g.output(outs[1]);
    let graph = g.build().unwrap();
    let fill = |n: usize, k: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * k).sin()).collect() };
    let mut qv = fill(h * t * d, 0.37);
    qv[(t + 1) * d + 5] = f32::NAN;
    let mut feeds = Feeds::new();
    feeds.insert(
        "q".into(),
        Tensor::from_shape_vec(vec![h, t, d], qv).unwrap(),
    );
    feeds.insert(
        "k".into(),
        Tensor::from_shape_vec(vec![h, s, d], fill(h * s * d, 0.11)).unwrap(),
    );
    feeds.insert(
        "v".into(),
        Tensor::from_shape_vec(vec![h, s, d], fill(h * s * d, 0.23)).unwrap(),
    );
    let w = Weights::from_map("none", Default::default());
    let mut ctx = RunCtx::default();
    graph
        .run(&w, feeds, &[outs[1]], &mut ctx)
        .unwrap()
        .remove(0)
}

#[test]
fn nan_query_gives_nan_probabilities_like_torch() {
    for strategy in [MatmulStrategy::RowStable, MatmulStrategy::Gemm] {
        for causal in [false, true] {
            let p = probs(strategy, causal);
            // torch: softmax of a row holding NaN is NaN everywhere in that row.
            let row = p.slice(ndarray::s![1, 1, ..]);
            assert!(
                row.iter().all(|v| v.is_nan()),
                "{strategy:?} causal={causal}: row with a NaN score must be NaN, got {row:?}"
            );
            // Every other row stays finite and sums to 1.
            for hh in 0..2 {
                for tt in 0..3 {
                    if (hh, tt) == (1, 1) {
                        continue;
                    }
                    let r = p.slice(ndarray::s![hh, tt, ..]);
                    assert!(r.iter().all(|v| v.is_finite()));
                    assert!((r.sum() - 1.0).abs() < 1e-5);
                }
            }
        }
    }
}
