//! Conformer block kernels: 1x1 conv, GLU, depthwise conv, block-local Shaw relative-position
//! attention (the conv module's BatchNorm is a generic channel norm, `crate::kernels::layer_norm`).

use crate::faults::ParamFault;
use crate::graph::{Dim, Kernel, KernelCtx, KernelOut, LearnedTable, Shape, Tensor};
use crate::kernels::layout::ports;
use crate::kernels::{
    bias, bias_shape, data, dims, par_ranges, same_dim, sgemm, simd, tensor, weight_roles_with_bias,
};
use xray_core::ops::Side;

use super::{sigmoid, softmax_in_place, token_rows};

/// A 1x1 `nn.Conv1d` over token-major rows: `y[t] = W[:, :, 0] x[t] + b`, weight
/// `[out, in, 1]` (HF's conv layout; the reference permutes to channel-major and back, which does
/// not change the per-element arithmetic).
///
/// Upstream: transformers v5.24.0 src/transformers/models/granite_speech/modeling_granite_speech.py
/// `GraniteSpeechConformerConvModule` (`up_conv`, `down_conv`).
#[derive(Debug, Clone)]
pub struct Pointwise {
    /// Whether the conv has a bias.
    pub bias: bool,
}

impl Kernel for Pointwise {
    ports!("pointwise_conv", [x: TokenMajor] -> [y: TokenMajor]);
    fn points(&self) -> &'static [Side] {
        &[Side::In, Side::Out]
    }
    fn weight_roles(&self) -> Vec<&'static str> {
        weight_roles_with_bias(self.bias)
    }
    fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (rows, k) = token_rows(&inputs[0], "x")?;
        let w = &weights[0];
        if w.len() != 3 || w[1] != k || w[2] != 1 {
            return Err(format!("weight must be [out, {k}, 1], got {w:?}"));
        }
        if self.bias {
            bias_shape(weights, w[0])?;
        }
        Ok(vec![vec![rows, Dim::Fixed(w[0])]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> KernelOut {
        let xs = dims(inputs[0], 2, "x")?;
        let ws = dims(weights[0], 3, "weight")?;
        let (m, k, n) = (xs[0], xs[1], ws[0]);
        if ws[1] != k || ws[2] != 1 {
            return Err(format!("x has {k} features, weight is {ws:?}"));
        }
        let x = data(inputs[0], "x")?;
        let w = data(weights[0], "weight")?;
        let mut y = vec![0f32; m * n];
        let mut beta = 0.0;
        if self.bias {
            let b = bias(weights, n)?;
            for row in y.chunks_exact_mut(n) {
                row.copy_from_slice(b);
            }
            beta = 1.0;
        }
        sgemm(m, k, n, x, (k, 1), w, (1, k), beta, &mut y, (n, 1))?;
        Ok(vec![tensor(&[m, n], y)?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"bias": self.bias})
    }
}

/// GLU over channels of token-major rows: `[T, 2C] -> [T, C]`, `a * sigmoid(b)` with `a` the
/// first half (`nn.GLU(dim=1)` on the channel-major tensor).
///
/// Upstream: transformers v5.24.0 src/transformers/models/granite_speech/modeling_granite_speech.py
/// `GraniteSpeechConformerConvModule` (`self.glu`).
#[derive(Debug, Clone, Default)]
pub struct Glu;

impl Kernel for Glu {
    ports!("glu", [x: TokenMajor] -> [y: TokenMajor]);
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (rows, c2) = token_rows(&inputs[0], "x")?;
        if c2 % 2 != 0 {
            return Err(format!("{c2} channels do not split into GLU halves"));
        }
        Ok(vec![vec![rows, Dim::Fixed(c2 / 2)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> KernelOut {
        let s = dims(inputs[0], 2, "x")?;
        let (t, c2) = (s[0], s[1]);
        if c2 % 2 != 0 {
            return Err(format!("{c2} channels do not split into GLU halves"));
        }
        let c = c2 / 2;
        let x = data(inputs[0], "x")?;
        let mut y = vec![0f32; t * c];
        for (row, out) in x.chunks_exact(c2).zip(y.chunks_exact_mut(c)) {
            for j in 0..c {
                out[j] = row[j] * sigmoid(row[c + j]);
            }
        }
        Ok(vec![tensor(&[t, c], y)?])
    }
}

/// Depthwise `nn.Conv1d(C, C, K, groups=C, bias=False)` over time on token-major rows, with zero
/// padding `K // 2` on the left and `K // 2 - (K + 1) % 2` on the right (cross-correlation).
/// Weight `[C, 1, K]`.
///
/// Upstream: transformers v5.24.0 src/transformers/models/granite_speech/modeling_granite_speech.py
/// `GraniteSpeechConformerDepthWiseConv1d`.
#[derive(Debug, Clone)]
pub struct DepthwiseConv {
    /// Kernel size K.
    pub kernel: usize,
}

impl DepthwiseConv {
    fn pads(&self) -> (usize, usize) {
        let pad = self.kernel / 2;
        (pad, pad - (self.kernel + 1) % 2)
    }
}

impl Kernel for DepthwiseConv {
    ports!("depthwise_conv", [x: TokenMajor] -> [y: TokenMajor], weights ["weight"]);
    /// Its output only: the HF `nn.Conv1d` takes the input already padded by its wrapper
    /// (`GraniteSpeechConformerDepthWiseConv1d` pads, then convolves without padding), a tensor
    /// this kernel never holds.
    fn points(&self) -> &'static [Side] {
        &[Side::Out]
    }
    fn time_kernel(&self) -> Option<&'static str> {
        Some("weight")
    }
    fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (_, c) = token_rows(&inputs[0], "x")?;
        if weights[0] != [c, 1, self.kernel] {
            return Err(format!(
                "weight must be [{c}, 1, {}], got {:?}",
                self.kernel, weights[0]
            ));
        }
        Ok(vec![inputs[0].clone()])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> KernelOut {
        let s = dims(inputs[0], 2, "x")?;
        let (t, c) = (s[0], s[1]);
        let k = self.kernel;
        if weights[0].shape() != [c, 1, k] {
            return Err(format!(
                "weight {:?} does not fit {c} channels, kernel {k}",
                weights[0].shape()
            ));
        }
        let (left, _) = self.pads();
        let x = data(inputs[0], "x")?;
        let w = data(weights[0], "weight")?;
        let mut y = vec![0f32; t * c];
        for ti in 0..t {
            let out = &mut y[ti * c..(ti + 1) * c];
            for ki in 0..k {
                // Input time of tap ki: ti + ki - left, zero outside [0, t).
                let src = ti + ki;
                if src < left || src - left >= t {
                    continue;
                }
                let xr = &x[(src - left) * c..(src - left + 1) * c];
                for ch in 0..c {
                    out[ch] += w[ch * k + ki] * xr[ch];
                }
            }
        }
        Ok(vec![tensor(&[t, c], y)?])
    }
    fn params(&self) -> serde_json::Value {
        let (l, r) = self.pads();
        serde_json::json!({"kernel": self.kernel, "pad_left": l, "pad_right": r})
    }
}

/// Block-local self-attention with Shaw relative positions. Inputs: `q` `[T, H*D]` (the
/// pre-normed, unpadded `to_q` output) and `kv` `[T, 2*H*D]` (`to_kv`: k is the first half);
/// weight `rel_pos_emb` `[2 * max_pos_emb + 1, D]`. Rows are cut into blocks of `context`; per
/// block and head, query row i and key row j of the block score
/// `scale * (q_i . k_j) + scale * (q_i . R[i - j + max_pos_emb])`; keys of the zero-padded tail of
/// the last block are masked (their probability is exactly 0, as `-FLT_MAX` gives in the
/// reference); softmax over j; `sum_j p v_j`; heads concatenated head-major. Output `[T, H*D]`
/// (before `to_out`). No attention across blocks. Fault seams: [`ParamFault::AttnScale`]
/// (replaces the score scale), [`ParamFault::Causal`] (mask keys after the query within a block).
///
/// Upstream: transformers v5.24.0 src/transformers/models/granite_speech/modeling_granite_speech.py
/// `GraniteSpeechConformerAttention.forward`, `GraniteSpeechCTCEncoder.__init__` (`attention_dists`).
#[derive(Debug, Clone)]
pub struct ShawBlockAttention {
    /// Heads.
    pub heads: usize,
    /// Head dim.
    pub dim_head: usize,
    /// Block size (`context_size`).
    pub context: usize,
    /// Zero offset of the relative-position table.
    pub max_pos_emb: usize,
    /// Score scale (`dim_head ** -0.5`).
    pub scale: f32,
    /// Fault only: causal within a block.
    pub causal: bool,
}

impl Kernel for ShawBlockAttention {
    ports!("shaw_block_attention", [q: TokenMajor, kv: TokenMajor] -> [y: TokenMajor], weights ["rel_pos_emb"]);
    fn table(&self) -> Option<LearnedTable> {
        Some(LearnedTable {
            role: "rel_pos_emb",
            positions: true,
            added: false,
        })
    }
    fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let inner = self.heads * self.dim_head;
        let (rows, qf) = token_rows(&inputs[0], "q")?;
        let (kv_rows, kvf) = token_rows(&inputs[1], "kv")?;
        same_dim(&rows, &kv_rows, "rows of q and kv")?;
        if qf != inner || kvf != 2 * inner {
            return Err(format!(
                "q must have {inner} and kv {} features, got {qf} and {kvf}",
                2 * inner
            ));
        }
        if weights[0] != [2 * self.max_pos_emb + 1, self.dim_head] {
            return Err(format!(
                "rel_pos_emb must be [{}, {}], got {:?}",
                2 * self.max_pos_emb + 1,
                self.dim_head,
                weights[0]
            ));
        }
        if self.context == 0 || self.context > self.max_pos_emb {
            return Err(format!(
                "context {} must be in 1..={}",
                self.context, self.max_pos_emb
            ));
        }
        Ok(vec![vec![rows, Dim::Fixed(inner)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> KernelOut {
        let (h, d, c) = (self.heads, self.dim_head, self.context);
        let inner = h * d;
        let qs = dims(inputs[0], 2, "q")?;
        let kvs = dims(inputs[1], 2, "kv")?;
        let t = qs[0];
        if qs[1] != inner || kvs != [t, 2 * inner] {
            return Err(format!(
                "q {qs:?} and kv {kvs:?} do not fit {h} heads of {d}"
            ));
        }
        if weights[0].shape() != [2 * self.max_pos_emb + 1, d] || c == 0 || c > self.max_pos_emb {
            return Err(format!(
                "rel_pos_emb {:?} does not fit max_pos_emb {} / context {c}",
                weights[0].shape(),
                self.max_pos_emb
            ));
        }
        let q = data(inputs[0], "q")?;
        let kv = data(inputs[1], "kv")?;
        let rel = data(weights[0], "rel_pos_emb")?;
        let nb = t.div_ceil(c);
        let scale = self.scale;
        // One unit = (block, head); each returns its [rows, d] context.
        let parts = par_ranges(nb * h, c * c * d * 3, |units| {
            let mut res = Vec::with_capacity(units.len());
            let mut sc = vec![0f32; c];
            for u in units {
                let (b, hi) = (u / h, u % h);
                let base = b * c;
                let rows = c.min(t - base);
                let mut out = vec![0f32; rows * d];
                for i in 0..rows {
                    let qi = &q[(base + i) * inner + hi * d..(base + i) * inner + (hi + 1) * d];
                    let n = if self.causal { i + 1 } else { rows };
                    for (j, s) in sc[..n].iter_mut().enumerate() {
                        let kj = &kv[(base + j) * 2 * inner + hi * d
                            ..(base + j) * 2 * inner + (hi + 1) * d];
                        let r = i + self.max_pos_emb - j;
                        let rj = &rel[r * d..(r + 1) * d];
                        *s = simd::dot(qi, kj) * scale + simd::dot(qi, rj) * scale;
                    }
                    softmax_in_place(&mut sc[..n]);
                    simd::weighted_sum(&mut out[i * d..(i + 1) * d], &sc[..n], |j| {
                        let off = (base + j) * 2 * inner + inner + hi * d;
                        &kv[off..off + d]
                    });
                }
                res.push((b, hi, rows, out));
            }
            res
        });
        let mut y = vec![0f32; t * inner];
        for (b, hi, rows, out) in parts.into_iter().flatten() {
            for i in 0..rows {
                let r = b * c + i;
                y[r * inner + hi * d..r * inner + (hi + 1) * d]
                    .copy_from_slice(&out[i * d..(i + 1) * d]);
            }
        }
        Ok(vec![tensor(&[t, inner], y)?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({
            "heads": self.heads, "dim_head": self.dim_head, "context": self.context,
            "max_pos_emb": self.max_pos_emb, "scale": self.scale, "causal": self.causal,
        })
    }
    fn with_param_fault(&self, fault: &ParamFault) -> Option<Box<dyn Kernel>> {
        crate::kernels::attention_faults!(self, fault)
    }
}
