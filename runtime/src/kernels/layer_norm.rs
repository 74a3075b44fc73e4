//! LayerNorm over the last (channel) axis of token-major rows.

use super::{data, dims, par_rows, rank, tensor};
use crate::faults::ParamFault;
use crate::graph::{port, Kernel, KernelCtx, Layout, Port, Shape, Tensor};

/// `torch.nn.LayerNorm(d, eps)` with elementwise affine weight and bias.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// Epsilon added to the variance.
    pub eps: f32,
}

impl LayerNorm {
    /// A LayerNorm with this epsilon (Whisper: torch's default 1e-5).
    pub fn new(eps: f32) -> Self {
        LayerNorm { eps }
    }
}

impl Kernel for LayerNorm {
    fn kind(&self) -> &'static str {
        "layer_norm"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("x", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn weight_roles(&self) -> Vec<&'static str> {
        vec!["weight", "bias"]
    }
    fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        rank(&inputs[0], 2, "x")?;
        let d = super::fixed(&inputs[0][1], "x features")?;
        if weights[0] != [d] || weights[1] != [d] {
            return Err(format!(
                "weight and bias must be [{d}], got {:?} and {:?}",
                weights[0], weights[1]
            ));
        }
        Ok(vec![inputs[0].clone()])
    }
    /// Statistics in f64 (mean, biased variance, `rstd = 1 / sqrt(var + eps)`), then per element
    /// `(x * rstd + (-rstd * mean)) * gamma + beta` in f32, the order of PyTorch's CPU kernel.
    ///
    /// Upstream: pytorch v2.11.0 aten/src/ATen/native/cpu/layer_norm_kernel.cpp
    /// `LayerNormKernelImplInternal`.
    fn run(
        &self,
        _ctx: &KernelCtx,
        inputs: &[&Tensor],
        weights: &[&Tensor],
    ) -> Result<Vec<Tensor>, String> {
        let s = dims(inputs[0], 2, "x")?;
        let (m, d) = (s[0], s[1]);
        let x = data(inputs[0], "x")?;
        let g = data(weights[0], "weight")?;
        let b = data(weights[1], "bias")?;
        if g.len() != d || b.len() != d {
            return Err(format!(
                "weight/bias have {}/{} elements, x has {d} features",
                g.len(),
                b.len()
            ));
        }
        let eps = self.eps as f64;
        let mut y = vec![0f32; m * d];
        par_rows(&mut y, d, 8 * d, |r0, out| {
            for (i, yr) in out.chunks_exact_mut(d).enumerate() {
                let xr = &x[(r0 + i) * d..(r0 + i + 1) * d];
                let mean = xr.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
                let var = xr
                    .iter()
                    .map(|&v| (v as f64 - mean) * (v as f64 - mean))
                    .sum::<f64>()
                    / d as f64;
                let rstd = 1.0 / (var + eps).sqrt();
                let scale = rstd as f32;
                let shift = (-rstd * mean) as f32;
                for j in 0..d {
                    yr[j] = (xr[j] * scale + shift) * g[j] + b[j];
                }
            }
        });
        Ok(vec![tensor(&[m, d], y)?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"eps": self.eps})
    }
    fn with_param_fault(&self, fault: &ParamFault) -> Option<Box<dyn Kernel>> {
        match fault {
            ParamFault::Eps(e) => Some(Box::new(LayerNorm { eps: *e })),
            _ => None,
        }
    }
}
