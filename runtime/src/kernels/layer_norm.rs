//! Normalizations over the last (channel) axis of token-major rows with per-channel parameters:
//! LayerNorm, RMSNorm and (inference) BatchNorm, each a [`ChannelNorm`] of its [`Norm`]. They
//! share their ports, shape inference, parameter checks, `eps` and fault seam
//! ([`ParamFault::Eps`]); a [`Norm`] says only its kind, its parameters and its row arithmetic.

use std::fmt;
use std::marker::PhantomData;

use super::layout::token_rows;
use super::{data, dims, par_rows, tensor};
use crate::faults::ParamFault;
use crate::graph::{port, Kernel, KernelCtx, KernelOut, Layout, Port, Shape, Tensor};
use xray_core::ops::Side;

/// What differs between channel norms.
pub trait Norm: fmt::Debug + Clone + Send + Sync + 'static {
    /// The op kind (graph JSON `kind`).
    const KIND: &'static str;
    /// The per-channel parameters' weight roles, in order (each `[c]`).
    const ROLES: &'static [&'static str];
    /// The sides it computes what its HF module computes ([`Kernel::points`]; default none).
    const POINTS: &'static [Side] = &[];
    /// Normalize the rows of `x` (`c > 0` channels each) into `y` (as long as `x`) with the
    /// parameters `p` (one per role, each `c` long) and `eps`.
    fn rows(x: &[f32], c: usize, p: &[&[f32]], eps: f32, y: &mut [f32]);
}

/// A [`Norm`] over the channels of token-major rows `[rows, c]`, with epsilon `eps`.
#[derive(Debug, Clone)]
pub struct ChannelNorm<N> {
    /// Epsilon (added to the variance or the mean square).
    pub eps: f32,
    norm: PhantomData<N>,
}

impl<N> ChannelNorm<N> {
    /// A norm with this epsilon.
    pub fn new(eps: f32) -> Self {
        ChannelNorm {
            eps,
            norm: PhantomData,
        }
    }
}

impl<N: Norm> Kernel for ChannelNorm<N> {
    fn kind(&self) -> &'static str {
        N::KIND
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("x", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn weight_roles(&self) -> Vec<&'static str> {
        N::ROLES.to_vec()
    }
    fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (_, c) = token_rows(&inputs[0], "x")?;
        for (w, n) in weights.iter().zip(N::ROLES) {
            if w != &[c] {
                return Err(format!("{n} must be [{c}], got {w:?}"));
            }
        }
        Ok(vec![inputs[0].clone()])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> KernelOut {
        let s = dims(inputs[0], 2, "x")?;
        let (m, c) = (s[0], s[1]);
        let x = data(inputs[0], "x")?;
        // Each parameter checked to hold `c` values, named when it does not.
        let p = weights
            .iter()
            .zip(N::ROLES)
            .map(|(w, n)| match data(w, n)? {
                v if v.len() == c => Ok(v),
                v => Err(format!("{n} has {} elements, x has {c} features", v.len())),
            })
            .collect::<Result<Vec<&[f32]>, String>>()?;
        if p.len() != N::ROLES.len() {
            return Err(format!("{} takes {}", N::KIND, N::ROLES.join(", ")));
        }
        let mut y = vec![0f32; m * c];
        if c > 0 {
            N::rows(x, c, &p, self.eps, &mut y);
        }
        Ok(vec![tensor(&[m, c], y)?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"eps": self.eps})
    }
    fn with_param_fault(&self, fault: &ParamFault) -> Option<Box<dyn Kernel>> {
        match fault {
            ParamFault::Eps(e) => Some(Box::new(ChannelNorm::<N>::new(*e))),
            _ => None,
        }
    }
    fn points(&self) -> &'static [Side] {
        N::POINTS
    }
}

/// `torch.nn.LayerNorm(d, eps)` with elementwise affine weight and bias.
pub type LayerNorm = ChannelNorm<Layer>;

/// LayerNorm's rows: statistics in f64 (mean, biased variance, `rstd = 1 / sqrt(var + eps)`),
/// then per element `(x * rstd + (-rstd * mean)) * gamma + beta` in f32, the order of PyTorch's
/// CPU kernel.
///
/// Upstream: pytorch v2.11.0 aten/src/ATen/native/cpu/layer_norm_kernel.cpp
/// `LayerNormKernelImplInternal`.
#[derive(Debug, Clone)]
pub struct Layer;

impl Norm for Layer {
    const KIND: &'static str = "layer_norm";
    const ROLES: &'static [&'static str] = &["weight", "bias"];
    const POINTS: &'static [Side] = &[Side::In, Side::Out];
    fn rows(x: &[f32], d: usize, p: &[&[f32]], eps: f32, y: &mut [f32]) {
        let (g, b) = (p[0], p[1]);
        let eps = eps as f64;
        par_rows(y, d, 8 * d, |r0, out| {
            for (i, yr) in out.chunks_exact_mut(d).enumerate() {
                let xr = &x[(r0 + i) * d..(r0 + i + 1) * d];
                let mean = sum_f64(xr, |v| v) / d as f64;
                let var = sum_f64(xr, |v| (v - mean) * (v - mean)) / d as f64;
                let rstd = 1.0 / (var + eps).sqrt();
                let scale = rstd as f32;
                let shift = (-rstd * mean) as f32;
                for j in 0..d {
                    yr[j] = (xr[j] * scale + shift) * g[j] + b[j];
                }
            }
        });
    }
}

/// `sum(f(x as f64))` over a row in eight interleaved f64 partial sums (lane `i % 8`), added
/// pairwise at the end: vectorizes, and in f64 the order changes no f32 result in practice.
fn sum_f64(x: &[f32], f: impl Fn(f64) -> f64) -> f64 {
    let mut acc = [0f64; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v as f64);
        }
    }
    for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
        *a += f(v as f64);
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// RMSNorm over token-major rows: `x * rsqrt(mean(x^2) + eps) * weight` (mean in f64, the rest in
/// f32).
pub type RmsNorm = ChannelNorm<Rms>;

/// RMSNorm's rows.
///
/// Upstream: transformers v5.24.0 src/transformers/models/granite/modeling_granite.py
/// `GraniteRMSNorm.forward`.
#[derive(Debug, Clone)]
pub struct Rms;

impl Norm for Rms {
    const KIND: &'static str = "rms_norm";
    const ROLES: &'static [&'static str] = &["weight"];
    const POINTS: &'static [Side] = &[Side::In, Side::Out];
    fn rows(x: &[f32], c: usize, p: &[&[f32]], eps: f32, y: &mut [f32]) {
        for (xr, yr) in x.chunks_exact(c).zip(y.chunks_exact_mut(c)) {
            let ms = (xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / c as f64) as f32;
            let r = 1.0 / (ms + eps).sqrt();
            for ((o, &v), &g) in yr.iter_mut().zip(xr).zip(p[0]) {
                *o = g * (v * r);
            }
        }
    }
}

/// `nn.BatchNorm1d` in inference form over the channels of token-major rows.
pub type BatchNorm = ChannelNorm<Batch>;

/// BatchNorm's rows: `alpha = weight / sqrt(running_var + eps)`,
/// `y = x * alpha + (bias - running_mean * alpha)`.
///
/// Upstream: transformers v5.24.0 src/transformers/models/granite_speech/modeling_granite_speech.py
/// `GraniteSpeechConformerConvModule` (`self.batch_norm`); pytorch v2.11.0
/// aten/src/ATen/native/cpu/batch_norm_kernel.cpp `batch_norm_cpu_collect_linear_and_constant_terms`.
#[derive(Debug, Clone)]
pub struct Batch;

impl Norm for Batch {
    const KIND: &'static str = "batch_norm";
    const ROLES: &'static [&'static str] = &["weight", "bias", "running_mean", "running_var"];
    const POINTS: &'static [Side] = &[Side::In, Side::Out];
    fn rows(x: &[f32], c: usize, p: &[&[f32]], eps: f32, y: &mut [f32]) {
        let alpha: Vec<f32> = (0..c).map(|j| p[0][j] / (p[3][j] + eps).sqrt()).collect();
        let beta: Vec<f32> = (0..c).map(|j| p[1][j] - p[2][j] * alpha[j]).collect();
        for (xr, yr) in x.chunks_exact(c).zip(y.chunks_exact_mut(c)) {
            for j in 0..c {
                yr[j] = xr[j] * alpha[j] + beta[j];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{BatchNorm, LayerNorm, RmsNorm};
    use crate::graph::{Kernel, KernelCtx, Tensor};

    fn run(k: &dyn Kernel, weights: &[Vec<f32>]) -> Result<Vec<Tensor>, String> {
        let x = Tensor::from_shape_vec(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
            .map_err(|e| e.to_string())?;
        let ws: Vec<Tensor> = weights
            .iter()
            .map(|w| Tensor::from_shape_vec(vec![w.len()], w.clone()).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        let wr: Vec<&Tensor> = ws.iter().collect();
        let ctx = KernelCtx {
            op: "norm",
            step: 0,
            weights_f16: &[],
        };
        k.run(&ctx, &[&x], &wr)
    }

    /// Every channel norm checks each parameter against the feature count and names the one
    /// that is wrong (BatchNorm used to say only "parameters must have 3 elements").
    #[test]
    fn channel_norms_name_the_parameter_of_the_wrong_length() {
        let ok = vec![1.0; 3];
        let short = vec![1.0; 2];
        let bn = BatchNorm::new(1e-5);
        let err = run(&bn, &[ok.clone(), ok.clone(), ok.clone(), short.clone()]).unwrap_err();
        assert!(err.contains("running_var has 2 elements"), "{err}");
        let err = run(&LayerNorm::new(1e-5), &[ok.clone(), short.clone()]).unwrap_err();
        assert!(err.contains("bias has 2 elements"), "{err}");
        let err = run(&RmsNorm::new(1e-5), &[short]).unwrap_err();
        assert!(err.contains("weight has 2 elements"), "{err}");
        for (k, n) in [
            (&bn as &dyn Kernel, 4),
            (&LayerNorm::new(1e-5), 2),
            (&RmsNorm::new(1e-5), 1),
        ] {
            let y = run(k, &vec![ok.clone(); n]).expect("well-formed norm runs");
            assert_eq!(y[0].shape(), &[2, 3]);
        }
    }
}
