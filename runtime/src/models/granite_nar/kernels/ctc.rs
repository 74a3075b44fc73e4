//! Self-conditioning and BPE-CTC kernels: row softmax, a channel column, posterior-weighted
//! pooling.

use crate::graph::{Dim, Kernel, KernelCtx, KernelOut, Shape, Tensor};
use crate::kernels::layout::ports;
use crate::kernels::{data, dims, rank, same_dim, tensor};

use super::{token_rows, SYM_BPE_FRAMES};

/// One channel of token-major rows as a plain vector: `[T, C] -> [T]` (the blank column of the
/// mid softmax).
///
/// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNarEncoder.forward` (`mid_probs[..., 0]`).
#[derive(Debug, Clone)]
pub struct Column {
    /// The channel.
    pub index: usize,
}

impl Kernel for Column {
    ports!("column", [x: TokenMajor] -> [y: Plain]);
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (rows, c) = token_rows(&inputs[0], "x")?;
        if self.index >= c {
            return Err(format!("channel {} of {c}", self.index));
        }
        Ok(vec![vec![rows]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        let s = dims(inputs[0], 2, "x")?;
        if self.index >= s[1] {
            return Err(format!("channel {} of {}", self.index, s[1]));
        }
        let x = data(inputs[0], "x")?;
        let y: Vec<f32> = x.chunks_exact(s[1]).map(|r| r[self.index]).collect();
        Ok(vec![tensor(&[s[0]], y)?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"index": self.index})
    }
}

/// Posterior-weighted pooling for the BPE-CTC head: `h` `[T, H]`, `blank` `[T]` ->
/// `[ceil(T / W), H]`. Importance `imp = 1 - blank`; T is right-padded with zero frames of zero
/// importance to whole windows; per window `sum_t h_t * (imp_t / (sum_window imp + 1e-8))`.
///
/// Upstream: oracle/xray_oracle/granite_nar.py `posterior_weighted_pool` (port
/// `_posterior_weighted_pool`).
#[derive(Debug, Clone)]
pub struct PosteriorPool {
    /// Frames per window.
    pub window: usize,
}

impl Kernel for PosteriorPool {
    ports!("posterior_weighted_pool", [h: TokenMajor, blank: Plain] -> [y: TokenMajor]);
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (rows, hdim) = token_rows(&inputs[0], "h")?;
        rank(&inputs[1], 1, "blank")?;
        same_dim(&rows, &inputs[1][0], "frames of h and blank")?;
        if self.window == 0 {
            return Err("window must be positive".into());
        }
        Ok(vec![vec![Dim::sym(SYM_BPE_FRAMES), Dim::Fixed(hdim)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        let s = dims(inputs[0], 2, "h")?;
        let (t, hd) = (s[0], s[1]);
        let bs = dims(inputs[1], 1, "blank")?;
        if bs[0] != t || self.window == 0 {
            return Err(format!(
                "blank has {} frames, h has {t} (window {})",
                bs[0], self.window
            ));
        }
        let h = data(inputs[0], "h")?;
        let blank = data(inputs[1], "blank")?;
        let w = self.window;
        let n = t.div_ceil(w);
        let mut y = vec![0f32; n * hd];
        for b in 0..n {
            let frames = b * w..((b + 1) * w).min(t);
            let imp: Vec<f32> = frames.clone().map(|f| 1.0 - blank[f]).collect();
            let denom = imp.iter().fold(0f32, |a, &v| a + v) + crate::models::granite_nar::POOL_EPS;
            let out = &mut y[b * hd..(b + 1) * hd];
            for (f, &i) in frames.zip(&imp) {
                let wt = i / denom;
                for (o, &v) in out.iter_mut().zip(&h[f * hd..(f + 1) * hd]) {
                    *o += v * wt;
                }
            }
        }
        Ok(vec![tensor(&[n, hd], y)?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"window": self.window, "eps": crate::models::granite_nar::POOL_EPS})
    }
}
