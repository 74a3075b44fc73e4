//! Projector window kernels: zero-padding to whole windows, window positions, query
//! initialisation, windowed multi-head cross-attention.

use crate::faults::ParamFault;
use crate::graph::{Dim, Kernel, KernelCtx, KernelOut, LearnedTable, Shape, Tensor};
use crate::kernels::layout::ports;
use crate::kernels::{data, dims, same_dim, simd, tensor};

use super::{softmax_in_place, token_rows, SYM_PROJ_ROWS, SYM_PROJ_TOKENS};

/// Zero right-pad token-major rows to whole windows: `[T, H] -> [ceil(T / block) * block, H]`.
///
/// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNarProjector.forward` (`F.pad`, `view`).
#[derive(Debug, Clone)]
pub struct WindowPad {
    /// Window rows.
    pub block: usize,
}

impl Kernel for WindowPad {
    ports!("window_pad", [x: TokenMajor] -> [y: TokenMajor]);
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (_, c) = token_rows(&inputs[0], "x")?;
        if self.block == 0 {
            return Err("block must be positive".into());
        }
        Ok(vec![vec![Dim::sym(SYM_PROJ_ROWS), Dim::Fixed(c)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        let s = dims(inputs[0], 2, "x")?;
        if self.block == 0 {
            return Err("block must be positive".into());
        }
        let rows = s[0].div_ceil(self.block) * self.block;
        let mut y = data(inputs[0], "x")?.to_vec();
        y.resize(rows * s[1], 0.0);
        Ok(vec![tensor(&[rows, s[1]], y)?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"block": self.block})
    }
}

/// `y = x + window_positions` broadcast over windows: x `[nb * block, H]`, weight
/// `[1, block, H]`.
///
/// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNarProjector.forward`
/// (`x + self.window_positions`).
#[derive(Debug, Clone, Default)]
pub struct AddWindowPositions;

impl Kernel for AddWindowPositions {
    ports!("add_window_positions", [x: TokenMajor] -> [y: TokenMajor], weights ["window_positions"]);
    fn table(&self) -> Option<LearnedTable> {
        Some(LearnedTable {
            role: "window_positions",
            positions: false,
            added: true,
        })
    }
    fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (_, c) = token_rows(&inputs[0], "x")?;
        let w = &weights[0];
        if w.len() != 3 || w[0] != 1 || w[2] != c || w[1] == 0 {
            return Err(format!(
                "window_positions must be [1, block, {c}], got {w:?}"
            ));
        }
        Ok(vec![inputs[0].clone()])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> KernelOut {
        let s = dims(inputs[0], 2, "x")?;
        let ws = dims(weights[0], 3, "window_positions")?;
        let (block, c) = (ws[1], ws[2]);
        if c != s[1] || block == 0 || s[0] % block != 0 {
            return Err(format!(
                "x {s:?} is not whole windows of window_positions {ws:?}"
            ));
        }
        let wp = data(weights[0], "window_positions")?;
        let mut y = inputs[0].as_standard_layout().into_owned();
        for (i, v) in y
            .as_slice_mut()
            .ok_or("output not contiguous")?
            .iter_mut()
            .enumerate()
        {
            *v += wp[i % (block * c)];
        }
        Ok(vec![y])
    }
}

/// Initial Q-Former queries: per window, the mean over each run of `downsample` rows of the
/// (zero-padded, un-positioned) window plus the learned `query` `[1, n_query, H]`:
/// `[nb * block, H] -> [nb * n_query, H]`.
///
/// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNarProjector.forward`
/// (`self.query + x.view(nb, n_query, downsample_rate, H).mean(dim=-2)`).
#[derive(Debug, Clone)]
pub struct QueryInit {
    /// Rows averaged per query.
    pub downsample: usize,
}

impl Kernel for QueryInit {
    ports!("query_init", [x: TokenMajor] -> [y: TokenMajor], weights ["query"]);
    fn table(&self) -> Option<LearnedTable> {
        Some(LearnedTable {
            role: "query",
            positions: false,
            added: true,
        })
    }
    fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (_, c) = token_rows(&inputs[0], "x")?;
        let w = &weights[0];
        if w.len() != 3 || w[0] != 1 || w[2] != c || w[1] == 0 || self.downsample == 0 {
            return Err(format!(
                "query must be [1, n_query, {c}], got {w:?} (downsample {})",
                self.downsample
            ));
        }
        Ok(vec![vec![Dim::sym(SYM_PROJ_TOKENS), Dim::Fixed(c)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> KernelOut {
        let s = dims(inputs[0], 2, "x")?;
        let ws = dims(weights[0], 3, "query")?;
        let (nq, c, ds) = (ws[1], ws[2], self.downsample);
        let block = nq * ds;
        if c != s[1] || block == 0 || s[0] % block != 0 {
            return Err(format!(
                "x {s:?} is not whole windows of {nq} queries x {ds} rows"
            ));
        }
        let nb = s[0] / block;
        let x = data(inputs[0], "x")?;
        let qw = data(weights[0], "query")?;
        let mut y = vec![0f32; nb * nq * c];
        for w in 0..nb {
            for qi in 0..nq {
                let out = &mut y[(w * nq + qi) * c..(w * nq + qi + 1) * c];
                for r in 0..ds {
                    let row = w * block + qi * ds + r;
                    for (o, &v) in out.iter_mut().zip(&x[row * c..(row + 1) * c]) {
                        *o += v;
                    }
                }
                for (o, &qv) in out.iter_mut().zip(&qw[qi * c..(qi + 1) * c]) {
                    *o = qv + *o / ds as f32;
                }
            }
        }
        Ok(vec![tensor(&[nb * nq, c], y)?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"downsample": self.downsample})
    }
}

/// Windowed multi-head cross-attention of the Q-Former: q `[nb * n_query, H]` attends, per
/// window, to the `block` rows of k / v `[nb * block, H]` (all of them: the zero-padded rows too),
/// softmax scale `scale` (`head_dim ** -0.5`), no mask. Output `[nb * n_query, H]`, heads
/// concatenated (before `o_proj`). Fault seam: [`ParamFault::AttnScale`] (replaces the scale).
///
/// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNarCrossAttention.forward`
/// (`F.scaled_dot_product_attention(q, k, v, is_causal=False)`).
#[derive(Debug, Clone)]
pub struct WindowCrossAttention {
    /// Heads.
    pub heads: usize,
    /// Queries per window.
    pub n_query: usize,
    /// Key rows per window.
    pub block: usize,
    /// Score scale.
    pub scale: f32,
}

impl Kernel for WindowCrossAttention {
    ports!("window_cross_attention", [q: TokenMajor, k: TokenMajor, v: TokenMajor] -> [y: TokenMajor]);
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (qr, qc) = token_rows(&inputs[0], "q")?;
        let (kr, kc) = token_rows(&inputs[1], "k")?;
        let (vr, vc) = token_rows(&inputs[2], "v")?;
        same_dim(&kr, &vr, "rows of k and v")?;
        if qc != kc || qc != vc || self.heads == 0 || qc % self.heads != 0 {
            return Err(format!(
                "q/k/v widths {qc}/{kc}/{vc} must agree and split into {} heads",
                self.heads
            ));
        }
        Ok(vec![vec![qr, Dim::Fixed(qc)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        let qs = dims(inputs[0], 2, "q")?;
        let ks = dims(inputs[1], 2, "k")?;
        let vs = dims(inputs[2], 2, "v")?;
        let (nq, blk, hn) = (self.n_query, self.block, self.heads);
        let c = qs[1];
        if nq == 0
            || blk == 0
            || hn == 0
            || c % hn != 0
            || ks != vs
            || ks[1] != c
            || qs[0] % nq != 0
            || ks[0] != qs[0] / nq * blk
        {
            return Err(format!(
                "q {qs:?}, k {ks:?}, v {vs:?} are not whole windows of {nq} queries / {blk} keys"
            ));
        }
        let nb = qs[0] / nq;
        let d = c / hn;
        let (q, k, v) = (
            data(inputs[0], "q")?,
            data(inputs[1], "k")?,
            data(inputs[2], "v")?,
        );
        let mut y = vec![0f32; qs[0] * c];
        let mut sc = vec![0f32; blk];
        for w in 0..nb {
            for hi in 0..hn {
                for i in 0..nq {
                    let qr = w * nq + i;
                    let qi = &q[qr * c + hi * d..qr * c + (hi + 1) * d];
                    for (j, s) in sc.iter_mut().enumerate() {
                        let kr = w * blk + j;
                        *s = simd::dot(qi, &k[kr * c + hi * d..kr * c + (hi + 1) * d]) * self.scale;
                    }
                    softmax_in_place(&mut sc);
                    let o = &mut y[qr * c + hi * d..qr * c + (hi + 1) * d];
                    simd::weighted_sum(o, &sc, |j| {
                        let kr = w * blk + j;
                        &v[kr * c + hi * d..kr * c + (hi + 1) * d]
                    });
                }
            }
        }
        Ok(vec![tensor(&[qs[0], c], y)?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"heads": self.heads, "n_query": self.n_query, "block": self.block, "scale": self.scale})
    }
    fn with_param_fault(&self, fault: &ParamFault) -> Option<Box<dyn Kernel>> {
        match fault {
            ParamFault::AttnScale(f) => Some(Box::new(WindowCrossAttention {
                scale: *f,
                ..self.clone()
            })),
            _ => None,
        }
    }
}
