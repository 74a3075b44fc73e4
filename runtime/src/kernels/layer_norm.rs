//! Normalizations over the last (channel) axis of token-major rows: LayerNorm and RMSNorm, and
//! the per-channel parameter checks every channel norm (also BatchNorm) shares.

use super::layout::token_rows;
use super::{data, dims, par_rows, tensor};
use crate::faults::ParamFault;
use crate::graph::{Kernel, KernelCtx, Shape, Tensor};
use crate::kernels::layout::ports;

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
    ports!("layer_norm", [x: TokenMajor] -> [y: TokenMajor], weights ["weight", "bias"]);
    fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        channel_norm_infer(inputs, weights, &self.weight_roles())
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
        let [g, b] = channel_params(weights, &self.weight_roles(), d)?[..] else {
            return Err("layer norm takes weight and bias".into());
        };
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

/// RMSNorm over token-major rows: `x * rsqrt(mean(x^2) + eps) * weight` (mean in f64, the rest in
/// f32). Fault seam: [`ParamFault::Eps`].
///
/// Upstream: transformers v5.24.0 src/transformers/models/granite/modeling_granite.py
/// `GraniteRMSNorm.forward`.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// Added to the mean square.
    pub eps: f32,
}

impl Kernel for RmsNorm {
    ports!("rms_norm", [x: TokenMajor] -> [y: TokenMajor], weights ["weight"]);
    fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        channel_norm_infer(inputs, weights, &self.weight_roles())
    }
    fn run(
        &self,
        _ctx: &KernelCtx,
        inputs: &[&Tensor],
        weights: &[&Tensor],
    ) -> Result<Vec<Tensor>, String> {
        let s = dims(inputs[0], 2, "x")?;
        let c = s[1];
        let [w] = channel_params(weights, &self.weight_roles(), c)?[..] else {
            return Err("rms norm takes one weight".into());
        };
        let mut y = inputs[0].as_standard_layout().into_owned();
        if c > 0 {
            for row in y
                .as_slice_mut()
                .ok_or("output not contiguous")?
                .chunks_exact_mut(c)
            {
                let ms = (row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / c as f64) as f32;
                let r = 1.0 / (ms + self.eps).sqrt();
                for (v, &g) in row.iter_mut().zip(w) {
                    *v = g * (*v * r);
                }
            }
        }
        Ok(vec![y])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"eps": self.eps})
    }
    fn with_param_fault(&self, fault: &ParamFault) -> Option<Box<dyn Kernel>> {
        match fault {
            ParamFault::Eps(e) => Some(Box::new(RmsNorm { eps: *e })),
            _ => None,
        }
    }
}

/// Shape inference of a channel norm: `x` token-major `[rows, c]`, every weight (named by
/// `roles`) `[c]`; the output has `x`'s shape.
pub(crate) fn channel_norm_infer(
    inputs: &[Shape],
    weights: &[Vec<usize>],
    roles: &[&str],
) -> Result<Vec<Shape>, String> {
    let (_, c) = token_rows(&inputs[0], "x")?;
    for (w, n) in weights.iter().zip(roles) {
        if w != &[c] {
            return Err(format!("{n} must be [{c}], got {w:?}"));
        }
    }
    Ok(vec![inputs[0].clone()])
}

/// The per-channel parameters of a channel norm, each checked to hold `c` values.
pub(crate) fn channel_params<'a>(
    weights: &[&'a Tensor],
    roles: &[&str],
    c: usize,
) -> Result<Vec<&'a [f32]>, String> {
    weights
        .iter()
        .zip(roles)
        .map(|(w, n)| {
            let v = data(w, n)?;
            if v.len() == c {
                Ok(v)
            } else {
                Err(format!("{n} has {} elements, x has {c} features", v.len()))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{LayerNorm, RmsNorm};
    use crate::graph::{Kernel, KernelCtx, Tensor};
    use crate::models::granite_nar::kernels::BatchNorm;

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
        let bn = BatchNorm { eps: 1e-5 };
        let err = run(&bn, &[ok.clone(), ok.clone(), ok.clone(), short.clone()]).unwrap_err();
        assert!(err.contains("running_var has 2 elements"), "{err}");
        let err = run(&LayerNorm::new(1e-5), &[ok.clone(), short.clone()]).unwrap_err();
        assert!(err.contains("bias has 2 elements"), "{err}");
        let err = run(&RmsNorm { eps: 1e-5 }, &[short]).unwrap_err();
        assert!(err.contains("weight has 2 elements"), "{err}");
        for (k, n) in [
            (&bn as &dyn Kernel, 4),
            (&LayerNorm::new(1e-5), 2),
            (&RmsNorm { eps: 1e-5 }, 1),
        ] {
            let y = run(k, &vec![ok.clone(); n]).expect("well-formed norm runs");
            assert_eq!(y[0].shape(), &[2, 3]);
        }
    }
}
