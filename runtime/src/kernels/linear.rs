//! `y = x W^T + b` over token-major rows, W in HF's `[out_features, in_features]` layout.

use super::{
    bias, bias_shape, data, dims, fixed, par_init_rows, par_ranges, rank, sgemm, simd, tensor,
    weight_roles_with_bias, MatmulStrategy, RowInit,
};
use crate::graph::{port, Dim, Kernel, KernelCtx, KernelOut, Layout, Port, Shape, Tensor};

/// A linear projection (`torch.nn.Linear`).
///
/// Upstream: torch.nn.functional.linear (`addmm(bias, x, W^T)`), as used by transformers v5.24.0
/// src/transformers/models/whisper/modeling_whisper.py (q/k/v/out_proj, fc1, fc2, proj_out).
#[derive(Debug, Clone)]
pub struct Linear {
    /// Whether the op has a bias weight.
    pub bias: bool,
    /// How the product is computed.
    pub strategy: MatmulStrategy,
}

impl Linear {
    /// A linear op with or without bias.
    pub fn new(bias: bool, strategy: MatmulStrategy) -> Self {
        Linear { bias, strategy }
    }
}

impl Kernel for Linear {
    fn points(&self) -> &'static [xray_core::ops::Side] {
        use xray_core::ops::Side;
        &[Side::In, Side::Out]
    }
    fn kind(&self) -> &'static str {
        "linear"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("x", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn weight_roles(&self) -> Vec<&'static str> {
        weight_roles_with_bias(self.bias)
    }
    fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        rank(&inputs[0], 2, "x")?;
        let w = &weights[0];
        if w.len() != 2 {
            return Err(format!("weight must be [out, in], got {w:?}"));
        }
        let k = fixed(&inputs[0][1], "x features")?;
        if k != w[1] {
            return Err(format!("x has {k} features, weight expects {}", w[1]));
        }
        if self.bias {
            bias_shape(weights, w[0])?;
        }
        Ok(vec![vec![inputs[0][0].clone(), Dim::Fixed(w[0])]])
    }
    fn run(&self, ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> KernelOut {
        let xs = dims(inputs[0], 2, "x")?;
        let ws = dims(weights[0], 2, "weight")?;
        let (m, k, n) = (xs[0], xs[1], ws[0]);
        if ws[1] != k {
            return Err(format!("x has {k} features, weight expects {}", ws[1]));
        }
        let x = data(inputs[0], "x")?;
        let w = data(weights[0], "weight")?;
        let b = self.bias.then(|| bias(weights, n)).transpose()?;
        let mut y;
        match self.strategy {
            MatmulStrategy::Gemm if super::gemm512::available() && x.len() == m * k => {
                y = super::gemm512::linear(m, k, n, x, w, b)?;
            }
            MatmulStrategy::Gemm => {
                // The bias rows, then `y += x W^T` (no zero fill first).
                y = match b {
                    Some(b) => par_init_rows(m, n, RowInit::Repeat(b)),
                    None => vec![0f32; m * n],
                };
                let beta = if b.is_some() { 1.0 } else { 0.0 };
                sgemm(m, k, n, x, (k, 1), w, (1, k), beta, &mut y, (n, 1))?;
            }
            MatmulStrategy::RowStable => {
                // Split the output columns across threads: each thread streams its slice of W
                // once for all rows (a decode step is a GEMV, memory-bound on W). An exact f16
                // mirror of W gives the same bits from half the bytes.
                let w16 = ctx.weight_f16(0).filter(|h| h.len() == w.len());
                let parts = par_ranges(n.div_ceil(4), 4 * k * m, |r| {
                    let (n0, n1) = ((r.start * 4).min(n), (r.end * 4).min(n));
                    let mut part = vec![0f32; m * (n1 - n0)];
                    match w16 {
                        Some(h) => simd::gemm_nt_rows_f16(x, h, n, b, k, m, n0, n1, &mut part),
                        None => simd::gemm_nt_rows(x, w, b, k, m, n0, n1, &mut part),
                    }
                    (n0, n1, part)
                });
                y = if parts.len() == 1 {
                    parts
                        .into_iter()
                        .next()
                        .map(|(_, _, p)| p)
                        .unwrap_or_default()
                } else {
                    let mut y = vec![0f32; m * n];
                    for (n0, n1, part) in parts {
                        let nb = n1 - n0;
                        if nb == 0 {
                            continue;
                        }
                        for r in 0..m {
                            y[r * n + n0..r * n + n1].copy_from_slice(&part[r * nb..(r + 1) * nb]);
                        }
                    }
                    y
                };
            }
        }
        Ok(vec![tensor(&[m, n], y)?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"bias": self.bias, "strategy": self.strategy})
    }
    fn f16_weight_roles(&self) -> Vec<usize> {
        match self.strategy {
            MatmulStrategy::RowStable => vec![0],
            MatmulStrategy::Gemm => Vec::new(),
        }
    }
}
