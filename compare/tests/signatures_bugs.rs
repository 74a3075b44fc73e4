//! The signatures for the bugs people actually make (issue 12 item 5), each on synthetic tensors:
//! a positive case with its measured parameter, and near misses that must not trigger it (clean
//! f32 rounding noise, and a different bug).

mod common;

use common::assert_explained;
use ndarray::{Array1, Array2, ArrayD, Axis, IxDyn};
use xray_compare::align::MemorySource;
use xray_compare::compare::{compare_graph, CompareOptions};
use xray_compare::localize::{build_graph, CheckpointSpec, StepRef, Steps};
use xray_compare::signatures::{
    diagnose, diagnose_with, explain_with, linear_grid, steps_subset, Activation, AxisSegment,
    ClampSide, ExplainOptions, Granularity, OpContext, Signature,
};

/// Deterministic uniform values in [-1, 1).
fn uniform(n: usize, seed: u64) -> Vec<f64> {
    xray_core::testing::xorshift(seed)
        .take(n)
        .map(|s| ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0)
        .collect()
}

/// Deterministic standard normal values (Box-Muller).
fn normal(n: usize, seed: u64) -> Vec<f64> {
    let u = uniform(2 * n, seed);
    (0..n)
        .map(|i| {
            let (a, b) = ((u[2 * i] + 1.0) / 2.0, (u[2 * i + 1] + 1.0) / 2.0);
            (-2.0 * a.max(1e-300).ln()).sqrt() * (2.0 * std::f64::consts::PI * b).cos()
        })
        .collect()
}

fn arr(shape: &[usize], v: Vec<f64>) -> ArrayD<f32> {
    ArrayD::from_shape_vec(IxDyn(shape), v.into_iter().map(|x| x as f32).collect()).unwrap()
}

/// `a` with f32-level relative noise (a clean rounding difference between two correct kernels).
fn f32_noise(a: &ArrayD<f32>, seed: u64) -> ArrayD<f32> {
    let u = uniform(a.len(), seed);
    let v: Vec<f32> = a
        .iter()
        .zip(u)
        .map(|(x, e)| x * (1.0 + 4e-7 * e as f32))
        .collect();
    ArrayD::from_shape_vec(a.raw_dim(), v).unwrap()
}

fn all(r: &ArrayD<f32>, x: &ArrayD<f32>, oc: &OpContext) -> Vec<Signature> {
    diagnose_with(&r.view(), &x.view(), &ExplainOptions::default(), oc)
}

fn names(r: &ArrayD<f32>, x: &ArrayD<f32>, oc: &OpContext) -> Vec<&'static str> {
    all(r, x, oc).iter().map(Signature::name).collect()
}

fn best(r: &ArrayD<f32>, x: &ArrayD<f32>, oc: &OpContext) -> Signature {
    all(r, x, oc).into_iter().next().expect("a signature")
}

/// Row softmax along the last axis, computed in f64 and stored as f32.
fn softmax(s: &[f64], n: usize, shape: &[usize]) -> ArrayD<f32> {
    let mut out = Vec::with_capacity(s.len());
    for row in s.chunks(n) {
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = row.iter().map(|v| (v - m).exp()).collect();
        let z: f64 = e.iter().sum();
        out.extend(e.iter().map(|v| v / z));
    }
    arr(shape, out)
}

#[test]
fn temperature_factor_from_row_log_probabilities() {
    let shape = [4, 6, 24];
    let s = normal(4 * 6 * 24, 1);
    let r = softmax(&s, 24, &shape);
    // Scores not scaled by 1/sqrt(8): the probabilities of sqrt(8)x the scores.
    let k = 8f64.sqrt();
    let x = softmax(&s.iter().map(|v| v * k).collect::<Vec<_>>(), 24, &shape);
    let oc = OpContext::default();
    match best(&r, &x, &oc) {
        Signature::Temperature {
            factor,
            domain,
            hint,
            row_factors,
            ..
        } => {
            assert!((factor - k).abs() < 1e-3 * k, "{factor}");
            assert!(row_factors[0] > 0.99 * k && row_factors[1] < 1.01 * k);
            assert_eq!(domain, "probabilities");
            assert!(hint.unwrap().contains("sqrt(8)"));
        }
        s => panic!("{s:?}"),
    }
    // Near miss: clean f32 noise on the probabilities.
    assert!(!names(&r, &f32_noise(&r, 2), &oc).contains(&"temperature"));
    // Near miss: a different factor per row is no single temperature.
    let per_row: Vec<f64> = s
        .chunks(24)
        .enumerate()
        .flat_map(|(i, row)| row.iter().map(move |v| v * (1.0 + 0.3 * (i % 5) as f64)))
        .collect();
    assert!(!names(&r, &softmax(&per_row, 24, &shape), &oc).contains(&"temperature"));
    // Near miss: a different bug (scores shifted by one key) is no temperature.
    let shifted: Vec<f64> = s
        .chunks(24)
        .flat_map(|row| (0..24).map(move |j| row[(j + 1) % 24]))
        .collect();
    assert!(!names(&r, &softmax(&shifted, 24, &shape), &oc).contains(&"temperature"));
}

#[test]
fn temperature_on_logits_needs_the_logits_flag() {
    // Logits scaled by 1.5 plus a per-row offset (no global scale fits).
    let r = arr(&[5, 50], normal(250, 3).iter().map(|v| 3.0 * v).collect());
    let mut x = r.mapv(|v| 1.5 * v);
    for (i, mut row) in x.axis_iter_mut(Axis(0)).enumerate() {
        row.mapv_inplace(|v| v + i as f32);
    }
    let logits = OpContext {
        logits: true,
        ..Default::default()
    };
    match best(&r, &x, &logits) {
        Signature::Temperature { factor, domain, .. } => {
            assert!((factor - 1.5).abs() < 1e-4, "{factor}");
            assert_eq!(domain, "logits");
        }
        s => panic!("{s:?}"),
    }
    // Without the flag a hidden state is never read as logits.
    assert!(!names(&r, &x, &OpContext::default()).contains(&"temperature"));
    assert!(!names(&r, &f32_noise(&r, 4), &logits).contains(&"temperature"));
}

/// LayerNorm over the last axis with the biased (`n`) or unbiased (`n - 1`) variance.
fn layer_norm(h: &[f64], n: usize, unbiased: bool, gamma: &[f64], beta: &[f64]) -> Vec<f64> {
    let mut out = Vec::with_capacity(h.len());
    for row in h.chunks(n) {
        let mu = row.iter().sum::<f64>() / n as f64;
        let ss: f64 = row.iter().map(|v| (v - mu).powi(2)).sum();
        let var = ss / if unbiased { (n - 1) as f64 } else { n as f64 };
        let inv = 1.0 / (var + 1e-5).sqrt();
        out.extend(
            row.iter()
                .enumerate()
                .map(|(j, v)| (v - mu) * inv * gamma[j] + beta[j]),
        );
    }
    out
}

#[test]
fn row_affine_names_the_unbiased_variance() {
    let (t, n) = (20, 64);
    let h: Vec<f64> = normal(t * n, 5)
        .iter()
        .enumerate()
        .map(|(i, v)| v * (1.0 + (i / n) as f64 * 0.2) + 0.3)
        .collect();
    let gamma: Vec<f64> = normal(n, 6).iter().map(|v| 1.0 + 0.2 * v).collect();
    let oc = OpContext::default();
    // Without a bias: X = a_r R.
    let zero = vec![0.0; n];
    let r = arr(&[t, n], layer_norm(&h, n, false, &gamma, &zero));
    let x = arr(&[t, n], layer_norm(&h, n, true, &gamma, &zero));
    let expect = ((n as f64 - 1.0) / n as f64).sqrt();
    // Every row's variance is far above epsilon: one slope for all rows, the more specific
    // `scale`, with the cause named.
    match best(&r, &x, &oc) {
        Signature::Scale { factor, hint, .. } => {
            assert!((factor - expect).abs() < 1e-5, "{factor} vs {expect}");
            assert!(hint.unwrap().contains("unbiased"));
        }
        s => panic!("{s:?}"),
    }
    // Rows with variances near epsilon get their own slopes: a per-row affine.
    let small: Vec<f64> = h
        .iter()
        .enumerate()
        .map(|(i, v)| v * 10f64.powf(-1.0 - 0.15 * (i / n) as f64))
        .collect();
    let r = arr(&[t, n], layer_norm(&small, n, false, &gamma, &zero));
    let x = arr(&[t, n], layer_norm(&small, n, true, &gamma, &zero));
    match best(&r, &x, &oc) {
        Signature::RowAffine {
            a_median,
            a_range,
            centred,
            ..
        } => {
            assert!((a_median - expect).abs() < 1e-3, "{a_median} vs {expect}");
            assert!(a_range[1] - a_range[0] > 1e-5, "{a_range:?}");
            assert!(!centred);
        }
        s => panic!("{s:?}"),
    }
    // With the norm's bias: X - β = a_r (R - β), found with a fitted centre.
    let beta: Vec<f64> = normal(n, 7).iter().map(|v| 0.5 * v).collect();
    let r = arr(&[t, n], layer_norm(&h, n, false, &gamma, &beta));
    let x = arr(&[t, n], layer_norm(&h, n, true, &gamma, &beta));
    match best(&r, &x, &oc) {
        Signature::RowAffine {
            a_median, centred, ..
        } => {
            assert!((a_median - expect).abs() < 1e-4, "{a_median} vs {expect}");
            assert!(centred);
        }
        s => panic!("{s:?}"),
    }
    // Near misses: f32 noise; one token's row changed (a subset, not statistics); a GELU variant.
    assert!(!names(&r, &f32_noise(&r, 8), &oc).contains(&"row_affine"));
    let mut one = r.clone();
    one.index_axis_mut(Axis(0), 3)
        .mapv_inplace(|v| 1.1 * v + 0.2);
    let n1 = names(&r, &one, &oc);
    assert_eq!(n1.first(), Some(&"subset"), "{n1:?}");
    assert!(!n1.contains(&"row_affine"));
    let g = r.mapv(|v| Activation::TanhGelu.apply(v as f64) as f32);
    let e = r.mapv(|v| Activation::ErfGelu.apply(v as f64) as f32);
    assert!(!names(&e, &g, &oc).contains(&"row_affine"));
}

/// Whisper's log-mel floor: `max(v, max(v) - floor)`, then `(v + 4) / 4`.
fn log_mel(v: &[f64], floor: f64) -> Vec<f64> {
    let m = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    v.iter().map(|x| (x.max(m - floor) + 4.0) / 4.0).collect()
}

/// A natural log where the reference takes log10, before Whisper's floor `max - 8` and `(v+4)/4`:
/// one affine map above both floors (slope ln 10), the floored elements apart; none when the only
/// difference is the floor (a `clamp`) or the map is the identity.
#[test]
fn a_log_of_another_base_before_a_floor_is_one_affine_map() {
    let shape = [16, 40];
    // log10 values over 12 decades: both floors hold many elements.
    let v: Vec<f64> = uniform(640, 5).iter().map(|u| -6.0 + 6.0 * u).collect();
    let r = arr(&shape, log_mel(&v, 8.0));
    let ln: Vec<f64> = v.iter().map(|x| x * std::f64::consts::LN_10).collect();
    let x = arr(&shape, log_mel(&ln, 8.0));
    let oc = OpContext::default();
    match best(&r, &x, &oc) {
        Signature::Affine {
            a,
            b,
            fitted,
            of,
            hint,
            ..
        } => {
            assert!((a - std::f64::consts::LN_10).abs() < 1e-4, "{a}");
            assert!((b - (1.0 - std::f64::consts::LN_10)).abs() < 1e-4, "{b}");
            assert!(fitted < of && fitted >= 64, "{fitted} of {of}");
            assert!(hint.unwrap().contains("natural log"));
        }
        s => panic!("{s:?}"),
    }
    // Only the floor differs: a clamp, not an affine map.
    assert!(!names(&r, &arr(&shape, log_mel(&v, 10.0)), &oc).contains(&"affine"));
    // No floor at all: a plain scale, said as such.
    let plain = arr(&shape, v.clone());
    let scaled = arr(&shape, ln);
    assert!(!names(&plain, &scaled, &oc).contains(&"affine"));
}

/// A log-mel whose filter bank is scaled filter by filter (a converter that leaves out Slaney's
/// area normalization): `log10(g_c·m) = log10(m) + log10(g_c)`, one offset per mel bin above both
/// floors (the floors `max - 8` move with the largest gain). A per-feature bias without floors is
/// the same statement over every element; one offset for all is not (`affine` or nothing), nor
/// is f32 noise.
#[test]
fn a_gain_per_channel_before_a_log_is_one_offset_per_channel() {
    let (bins, frames) = (20, 64);
    let shape = [bins, frames];
    let v: Vec<f64> = uniform(bins * frames, 11)
        .iter()
        .map(|u| -5.0 + 5.0 * u)
        .collect();
    let gain = |c: usize| 10f64.powf(0.05 * c as f64);
    let g: Vec<f64> = v
        .iter()
        .enumerate()
        .map(|(i, x)| x + gain(i / frames).log10())
        .collect();
    let (r, x) = (arr(&shape, log_mel(&v, 8.0)), arr(&shape, log_mel(&g, 8.0)));
    let oc = OpContext::default();
    match best(&r, &x, &oc) {
        Signature::ChannelOffset {
            axis,
            slices,
            range,
            fitted,
            of,
            floors,
            ..
        } => {
            assert_eq!((axis, slices), (0, bins as u64));
            // (v + 4) / 4 divides each log10 offset by four.
            let (lo, hi) = (0.0, 0.05 * (bins - 1) as f64 / 4.0);
            assert!(
                (range[0] - lo).abs() < 1e-5 && (range[1] - hi).abs() < 1e-5,
                "{range:?}"
            );
            assert!(floors && fitted < of && fitted >= 64, "{fitted} of {of}");
        }
        s => panic!("{s:?}"),
    }
    // A bias per feature of [tokens, features], no floor: every element fitted, axis 1.
    let t = arr(&[32, 12], normal(32 * 12, 12));
    let biased = arr(
        &[32, 12],
        t.iter()
            .enumerate()
            .map(|(i, v)| *v as f64 + 0.1 * ((i % 12) as f64 - 5.0))
            .collect(),
    );
    match best(&t, &biased, &oc) {
        Signature::ChannelOffset {
            axis,
            floors,
            of,
            fitted,
            ..
        } => assert_eq!((axis, floors, fitted), (1, false, of)),
        s => panic!("{s:?}"),
    }
    // One offset for every element: not per channel.
    let shifted = arr(&[32, 12], t.iter().map(|v| *v as f64 + 0.25).collect());
    assert!(!names(&t, &shifted, &oc).contains(&"channel_offset"));
    // f32 noise: nothing.
    assert!(!names(&t, &f32_noise(&t, 13), &oc).contains(&"channel_offset"));
}

#[test]
fn clamp_reports_the_floor() {
    let shape = [16, 40];
    let v: Vec<f64> = uniform(640, 9).iter().map(|u| -6.0 + 7.0 * u).collect();
    let r = arr(&shape, log_mel(&v, 8.0));
    let oc = OpContext::default();
    // The runtime floors 10 below the max instead of 8: the reference's floored elements differ.
    let x = arr(&shape, log_mel(&v, 10.0));
    let m = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let ref_floor = (m - 8.0 + 4.0) / 4.0;
    match best(&r, &x, &oc) {
        Signature::Clamp {
            side,
            threshold,
            reference_range,
            runtime_range,
            differing,
            ..
        } => {
            assert_eq!(side, ClampSide::Below);
            assert!(
                (threshold - ref_floor).abs() < 1e-5,
                "{threshold} vs {ref_floor}"
            );
            assert_eq!(reference_range[0], reference_range[1]);
            assert!(runtime_range[0] < runtime_range[1]);
            assert!(differing > 10);
        }
        s => panic!("{s:?}"),
    }
    // The runtime floors 6 below: its own floor is the constant side.
    let x6 = arr(&shape, log_mel(&v, 6.0));
    match best(&r, &x6, &oc) {
        Signature::Clamp {
            side,
            threshold,
            runtime_range,
            ..
        } => {
            assert_eq!(side, ClampSide::Below);
            let run_floor = (m - 6.0 + 4.0) / 4.0;
            assert!((runtime_range[0] - run_floor).abs() < 1e-5);
            assert!(threshold < run_floor);
        }
        s => panic!("{s:?}"),
    }
    // Near misses: f32 noise; the largest values perturbed at random (beyond a threshold, but
    // neither side constant: no clamp).
    assert!(!names(&r, &f32_noise(&r, 10), &oc).contains(&"clamp"));
    let noise = uniform(640, 11);
    let big: Vec<f64> = r
        .iter()
        .zip(&noise)
        .map(|(a, e)| {
            if *a > 0.9 {
                *a as f64 + 0.1 * e
            } else {
                *a as f64
            }
        })
        .collect();
    assert!(!names(&r, &arr(&shape, big), &oc).contains(&"clamp"));
}

fn act(u: &ArrayD<f32>, f: Activation) -> ArrayD<f32> {
    u.mapv(|v| f.apply(v as f64) as f32)
}

#[test]
fn elementwise_names_the_activation_variant() {
    let u = arr(
        &[16, 64],
        normal(1024, 12).iter().map(|v| 2.0 * v).collect(),
    );
    let r = act(&u, Activation::ErfGelu);
    for g in [
        Activation::TanhGelu,
        Activation::QuickGelu,
        Activation::Silu,
        Activation::Relu,
    ] {
        let x = act(&u, g);
        // With the op's input.
        let with = OpContext {
            op_input: Some(u.view()),
            ..Default::default()
        };
        match best(&r, &x, &with) {
            Signature::Elementwise {
                runtime,
                reference,
                from_input,
                ..
            } => {
                assert_eq!(runtime, Some(g));
                assert_eq!(reference, Some(Activation::ErfGelu));
                assert!(from_input);
            }
            s => panic!("{g:?} with input: {s:?}"),
        }
        // Output only: the map R -> X on the positive side.
        match best(&r, &x, &OpContext::default()) {
            Signature::Elementwise {
                runtime,
                reference,
                from_input,
                ..
            } => {
                assert_eq!((runtime, reference), (Some(g), Some(Activation::ErfGelu)));
                assert!(!from_input);
            }
            s => panic!("{g:?} output only: {s:?}"),
        }
    }
    // An unknown smooth variant: unnamed, the nearest known one reported.
    let x = u.mapv(|v| {
        let v = v as f64;
        (0.5 * v * (1.0 + (0.8 * v).tanh())) as f32
    });
    let with = OpContext {
        op_input: Some(u.view()),
        ..Default::default()
    };
    match best(&r, &x, &with) {
        Signature::Elementwise { runtime, .. } => assert_eq!(runtime, None),
        s => panic!("{s:?}"),
    }
    // Near misses: f32 noise; a per-row scale (normalization, a different bug).
    assert!(!names(&r, &f32_noise(&r, 13), &with).contains(&"elementwise"));
    assert!(!names(&r, &f32_noise(&r, 13), &OpContext::default()).contains(&"elementwise"));
    let mut rows = r.clone();
    for (i, mut row) in rows.axis_iter_mut(Axis(0)).enumerate() {
        row.mapv_inplace(|v| v * (0.9 + 0.02 * i as f32));
    }
    assert!(!names(&r, &rows, &with).contains(&"elementwise"));
    assert!(!names(&r, &rows, &OpContext::default()).contains(&"elementwise"));
}

/// Symmetric per-row int-`bits` rounding of `w` `[out, in]`.
fn quantize_rows(w: &Array2<f32>, bits: u32, per_row: bool) -> Array2<f32> {
    let levels = ((1u32 << (bits - 1)) - 1) as f32;
    let all = w.iter().fold(0f32, |m, v| m.max(v.abs()));
    let mut q = w.clone();
    for mut row in q.axis_iter_mut(Axis(0)) {
        let m = if per_row {
            row.iter().fold(0f32, |m, v| m.max(v.abs()))
        } else {
            all
        };
        let s = m / levels;
        row.mapv_inplace(|v| (v / s).round() * s);
    }
    q
}

fn linear(x: &Array2<f32>, w: &Array2<f32>, b: &Array1<f32>) -> Array2<f32> {
    let x64 = x.mapv(|v| v as f64);
    let w64 = w.mapv(|v| v as f64);
    let y = x64.dot(&w64.t());
    (y + &b.mapv(|v| v as f64)).mapv(|v| v as f32)
}

#[test]
fn grid_quantization_step_and_bits() {
    let (n, k, m) = (200, 32, 16);
    let x = Array2::from_shape_vec(
        (n, k),
        normal(n * k, 14).iter().map(|v| *v as f32).collect(),
    )
    .unwrap();
    let w = Array2::from_shape_vec(
        (m, k),
        normal(m * k, 15).iter().map(|v| 0.1 * *v as f32).collect(),
    )
    .unwrap();
    let b = Array1::from_iter(normal(m, 16).iter().map(|v| 0.05 * *v as f32));
    let yr = linear(&x, &w, &b);
    for (bits, per_row) in [(8, true), (4, false), (6, true)] {
        let wq = quantize_rows(&w, bits, per_row);
        let yq = linear(&x, &wq, &b);
        let want_g = if per_row {
            Granularity::PerRow
        } else {
            Granularity::PerTensor
        };
        for given in [Some(w.view()), None] {
            match linear_grid(&x.view(), &yr.view(), &yq.view(), given.as_ref(), 1e-3) {
                Some(Signature::GridQuantization {
                    granularity,
                    bits: b,
                    step,
                    weight_recovered,
                    ..
                }) => {
                    assert_eq!(
                        (granularity, b),
                        (want_g, bits),
                        "given {}",
                        given.is_some()
                    );
                    assert_eq!(weight_recovered, given.is_none());
                    let levels = ((1u32 << (bits - 1)) - 1) as f64;
                    let all = w.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
                    assert!(step[1] <= all / levels * (1.0 + 1e-3));
                    assert!(step[1] >= all / levels * (1.0 - 1e-3));
                }
                s => panic!(
                    "bits {bits} per_row {per_row} given {}: {s:?}",
                    given.is_some()
                ),
            }
        }
    }
    // Through diagnose_with at the op: the op's input is the context.
    let yq = linear(&x, &quantize_rows(&w, 8, true), &b);
    let oc = OpContext {
        op_input: Some(x.view().into_dyn()),
        ..Default::default()
    };
    let (r, q) = (yr.clone().into_dyn(), yq.into_dyn());
    assert_eq!(best(&r, &q, &oc).name(), "grid_quantization");
    // Without the input nothing claims it.
    assert!(!names(&r, &q, &OpContext::default()).contains(&"grid_quantization"));
    // Near misses: f32 noise on the output; a weight perturbed off any grid; a bf16 weight.
    let noisy = f32_noise(&r, 17);
    assert!(!names(&r, &noisy, &oc).contains(&"grid_quantization"));
    let off = &w
        + &Array2::from_shape_vec(
            (m, k),
            normal(m * k, 18).iter().map(|v| 4e-4 * *v as f32).collect(),
        )
        .unwrap();
    let yo = linear(&x, &off, &b);
    assert!(linear_grid(&x.view(), &yr.view(), &yo.view(), None, 1e-3).is_none());
    assert!(linear_grid(&x.view(), &yr.view(), &yo.view(), Some(&w.view()), 1e-3).is_none());
    let wb = w.mapv(|v| half::bf16::from_f32(v).to_f32());
    let yb = linear(&x, &wb, &b);
    assert!(linear_grid(&x.view(), &yr.view(), &yb.view(), None, 1e-3).is_none());
    // Fewer rows than input features and no weight: not identifiable, so not claimed.
    let (xs, ys, yqs) = (
        x.slice(ndarray::s![..20, ..]),
        yr.slice(ndarray::s![..20, ..]),
        linear(&x, &quantize_rows(&w, 8, true), &b),
    );
    assert!(linear_grid(&xs, &ys, &yqs.slice(ndarray::s![..20, ..]), None, 1e-3).is_none());
}

#[test]
fn wiring_names_the_tensor_read() {
    let shape = [4, 8, 16];
    let layer0 = arr(&shape, normal(512, 19));
    let layer1 = arr(&shape, normal(512, 20));
    let layer2 = arr(&shape, normal(512, 21));
    let other_shape = arr(&[8, 4, 16], layer0.iter().map(|v| *v as f64).collect());
    let oc = OpContext {
        candidates: vec![
            ("dec.layer.0.k@step0".into(), layer0.view()),
            ("dec.layer.2.k@step0".into(), layer2.view()),
            ("dec.layer.0.q@step0".into(), other_shape.view()),
        ],
        ..Default::default()
    };
    // Layer 1 read layer 0's slab (with its own f32 noise).
    let x = f32_noise(&layer0, 22);
    match best(&layer1, &x, &oc) {
        Signature::Wiring { source, residual } => {
            assert_eq!(source, "dec.layer.0.k@step0");
            assert!(residual < 1e-6);
        }
        s => panic!("{s:?}"),
    }
    // Near misses: f32 noise of its own tensor; a different bug (one head swapped in from
    // nowhere) matches no candidate.
    assert!(!names(&layer1, &f32_noise(&layer1, 23), &oc).contains(&"wiring"));
    let mut part = layer1.clone();
    part.index_axis_mut(Axis(0), 2)
        .assign(&layer0.index_axis(Axis(0), 2));
    let n = names(&layer1, &part, &oc);
    assert!(!n.contains(&"wiring"), "{n:?}");
    // ... but a subset whose one head was read from layer 0's slab, named.
    match best(&layer1, &part, &oc) {
        Signature::Subset {
            indices, sources, ..
        } => {
            assert_eq!(indices, vec![2]);
            assert_eq!(sources, vec![(2, "dec.layer.0.k@step0".to_string())]);
        }
        s => panic!("{s:?}"),
    }
    // A head changed to data no candidate holds: a subset with no source.
    let mut fresh = layer1.clone();
    fresh.index_axis_mut(Axis(0), 2).mapv_inplace(|v| v + 0.5);
    match best(&layer1, &fresh, &oc) {
        Signature::Subset { sources, .. } => assert!(sources.is_empty()),
        s => panic!("{s:?}"),
    }
}

#[test]
fn subset_indices_read_as_named_ranges() {
    let r = arr(&[10, 256], normal(2560, 24));
    let mut x = r.clone();
    for j in 64..128 {
        x.index_axis_mut(Axis(1), j).mapv_inplace(|v| v + 1.0);
    }
    let segs: Vec<AxisSegment> = (0..4)
        .map(|i| AxisSegment {
            axis: 1,
            start: 64 * i,
            end: 64 * (i + 1),
            name: format!("part {i} of 4: enc.block.{}.out@step0", [0, 2, 4, 6][i]),
        })
        .collect();
    let opts = ExplainOptions {
        axis_names: vec!["enc_frames".into(), "cat_dim".into()],
        ..Default::default()
    };
    let oc = OpContext {
        segments: segs,
        ..Default::default()
    };
    let e = explain_with(&r.view(), &x.view(), &opts, &oc);
    assert_explained(
        &e,
        xray_core::SignatureKind::Subset,
        &["64..127 = part 1 of 4: enc.block.2.out@step0"],
    );
    assert_eq!(e.evidence["ranges"], serde_json::json!([[64, 127]]));
    // Without segments: the plain range, never 64 separate indices.
    let plain = explain_with(&r.view(), &x.view(), &opts, &OpContext::default());
    assert!(
        plain.detail.contains("differ: 64..127;"),
        "{}",
        plain.detail
    );
    let s = steps_subset(&[(0, false), (1, true), (2, true), (3, false), (4, false)]).unwrap();
    assert!(s.detail(&[]).contains("1..2"));
}

/// The pipeline's one call site: an origin gets its wiring candidates and its concatenated
/// inputs' names from the graph and the reference side.
#[test]
fn pipeline_passes_candidates_and_segments() {
    let spec = |name: &str, inputs: Vec<&str>| {
        CheckpointSpec::bare(
            name,
            Steps::Once,
            inputs.into_iter().map(|n| (n, StepRef::Same)).collect(),
        )
    };
    let specs = vec![
        spec("enc.block.0.out", vec![]),
        spec("enc.block.1.out", vec!["enc.block.0.out"]),
        spec("enc.block.2.out", vec!["enc.block.1.out"]),
        spec(
            "enc.cat_out",
            vec!["enc.block.0.out", "enc.block.1.out", "enc.block.2.out"],
        ),
    ];
    let g = build_graph(&specs, &[0]).unwrap();
    let blocks: Vec<ArrayD<f32>> = (0..3).map(|i| arr(&[6, 32], normal(192, 30 + i))).collect();
    let cat = ndarray::concatenate(
        Axis(1),
        &blocks.iter().map(|b| b.view()).collect::<Vec<_>>(),
    )
    .unwrap();
    let mut src = MemorySource::default();
    for (i, b) in blocks.iter().enumerate() {
        src.insert(
            &format!("enc.block.{i}.out"),
            0,
            xray_core::Layout::TokenMajor,
            b.clone(),
            b.clone(),
        );
    }
    let mut x = cat.clone();
    for j in 32..64 {
        x.index_axis_mut(Axis(1), j).mapv_inplace(|v| -v + 0.25);
    }
    src.insert(
        "enc.cat_out",
        0,
        xray_core::Layout::TokenMajor,
        cat.clone(),
        x,
    );
    let c = compare_graph(&g, &src, &CompareOptions::default()).unwrap();
    let fd = c.first_divergence.unwrap();
    assert_eq!(fd.checkpoint, "enc.cat_out");
    assert_explained(
        &fd.explanation.unwrap(),
        xray_core::SignatureKind::Subset,
        &["32..63 = part 1 of 3: enc.block.1.out@step0"],
    );
    // Wiring: block 2 computed from the wrong input holds block 0's tensor.
    let mut src = MemorySource::default();
    for (i, b) in blocks.iter().enumerate() {
        let run = if i == 2 { blocks[0].clone() } else { b.clone() };
        src.insert(
            &format!("enc.block.{i}.out"),
            0,
            xray_core::Layout::TokenMajor,
            b.clone(),
            run,
        );
    }
    src.insert(
        "enc.cat_out",
        0,
        xray_core::Layout::TokenMajor,
        cat.clone(),
        cat,
    );
    let c = compare_graph(&g, &src, &CompareOptions::default()).unwrap();
    let fd = c.first_divergence.unwrap();
    assert_eq!(fd.checkpoint, "enc.block.2.out");
    let ex = fd.explanation.unwrap();
    assert_explained(&ex, xray_core::SignatureKind::Wiring, &[]);
    assert_eq!(ex.evidence["source"], "enc.block.0.out@step0");
}

#[test]
fn plain_noise_and_unrelated_data_still_match_nothing() {
    let r = arr(&[6, 16, 8], uniform(768, 40));
    let noisy = arr(
        &[6, 16, 8],
        r.iter()
            .zip(uniform(768, 41))
            .map(|(a, e)| *a as f64 + 1e-2 * e)
            .collect(),
    );
    assert!(diagnose(&r.view(), &noisy.view(), &ExplainOptions::default()).is_empty());
    let other = arr(&[6, 16, 8], uniform(768, 42));
    assert!(diagnose(&r.view(), &other.view(), &ExplainOptions::default()).is_empty());
    // A LayerNorm-shaped input with every context given: still nothing.
    let oc = OpContext {
        op_input: Some(other.view()),
        candidates: vec![("other@step0".into(), other.view())],
        ..Default::default()
    };
    assert!(diagnose_with(&r.view(), &noisy.view(), &ExplainOptions::default(), &oc).is_empty());
}

/// A tensor left all zeros (a bias never loaded) is the scale 0, said as what it is, not as
/// "0 × reference"; a tensor scaled by a small factor is still a scale.
#[test]
fn an_all_zero_tensor_is_said_to_be_zeros() {
    let r = arr(&[384], normal(384, 7));
    let zeros = ArrayD::<f32>::zeros(IxDyn(&[384]));
    let oc = OpContext::default();
    let s = best(&r, &zeros, &oc);
    assert!(
        matches!(s, Signature::Scale { factor, .. } if factor == 0.0),
        "{s:?}"
    );
    let text = s.detail(&[]);
    assert!(text.starts_with("runtime is all zeros"), "{text}");
    let small = r.mapv(|v| v * 0.25);
    let text = best(&r, &small, &oc).detail(&[]);
    assert!(text.contains("0.250000 × reference"), "{text}");
}
