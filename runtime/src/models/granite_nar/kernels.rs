//! Granite-NAR-specific kernels (the generic ones live in `crate::kernels`): block-local Shaw
//! attention, the conformer conv module pieces (pointwise conv, GLU, depthwise conv, BatchNorm),
//! SiLU, scaled residual adds, the self-conditioning and BPE-CTC pieces, the projector's window
//! ops and windowed cross-attention, and the Granite LM's RMSNorm, RoPE, GQA attention and SwiGLU.
//!
//! All tensors are f32 in standard layout. Reductions that PyTorch does in f32 are done here in
//! f32 or f64 (never less precise); the tolerance budget of the parity tests covers the
//! difference in summation order.

use crate::faults::ParamFault;
use crate::graph::{port, port_any, Dim, Kernel, KernelCtx, Layout, Port, Shape, Tensor};
use crate::kernels::{data, dims, fixed, par_ranges, rank, same_dim, sgemm, simd, tensor};

/// Symbol: mel frames kept by the frontend.
pub const SYM_MEL_FRAMES: &str = "mel_frames";
/// Symbol: encoder frames (contract `enc_frames`).
pub const SYM_ENC_FRAMES: &str = "enc_frames";
/// Symbol: pooled BPE-CTC frames `ceil(enc_frames / bpe_pooling_window)`.
pub const SYM_BPE_FRAMES: &str = "bpe_frames";
/// Symbol: encoder frames zero-padded to whole attention blocks is internal to the attention op;
/// this one is the projector's padded rows `ceil(enc_frames / block_size) * block_size`.
pub const SYM_PROJ_ROWS: &str = "proj_rows";
/// Symbol: projector tokens `ceil(enc_frames / block_size) * n_query`.
pub const SYM_PROJ_TOKENS: &str = "proj_tokens";
/// Symbol: audio rows the LM sees, `floor(enc_frames / downsample_rate)`.
pub const SYM_N_AUDIO: &str = "n_audio";
/// Symbol: template length.
pub const SYM_N_TEXT: &str = "n_text";
/// Symbol: `n_audio + n_text`.
pub const SYM_N_TOTAL: &str = "n_total";

/// `x * sigmoid(x)` as `x / (1 + exp(-x))`.
#[inline]
fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `1 / (1 + exp(-x))`.
#[inline]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Softmax of a row in place: max, `exp(x - max)`, f64 sum, multiply by `1 / sum`.
fn softmax_in_place(x: &mut [f32]) {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut s = 0f64;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        s += *v as f64;
    }
    let inv = (1.0 / s) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

fn token_rows(s: &Shape, what: &str) -> Result<(Dim, usize), String> {
    rank(s, 2, what)?;
    Ok((s[0].clone(), fixed(&s[1], &format!("{what} features"))?))
}

// ------------------------------------------------------------------------------------------------
// Elementwise
// ------------------------------------------------------------------------------------------------

/// SiLU, elementwise, any layout (`nn.SiLU`).
///
/// Upstream: pytorch v2.11.0 aten/src/ATen/native/cpu/Activation.cpp `silu_kernel`
/// (`x / (1 + exp(-x))`).
#[derive(Debug, Clone, Default)]
pub struct Silu;

impl Kernel for Silu {
    fn kind(&self) -> &'static str {
        "silu"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port_any("x")]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port_any("y")]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        Ok(vec![inputs[0].clone()])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        Ok(vec![inputs[0].mapv(silu)])
    }
}

/// `y = a + scale * b` (a residual add whose branch is scaled: the conformer's macaron
/// half-step `0.5`, Granite's `residual_multiplier`; `scale = 1` is a plain add, the
/// self-conditioning bypass). Same shape and layout. Fault seam: [`ParamFault::SkipBranch`]
/// returns `a`.
///
/// Upstream: transformers v5.24.0 src/transformers/models/granite_speech/modeling_granite_speech.py
/// `GraniteSpeechConformerBlock.forward` (`0.5 * self.ff1(h) + h`); src/transformers/models/granite/
/// modeling_granite.py `GraniteDecoderLayer.forward` (`residual + h * self.residual_multiplier`).
#[derive(Debug, Clone)]
pub struct ScaledAdd {
    /// Branch multiplier.
    pub scale: f32,
    /// Fault only: drop the branch.
    skip_branch: bool,
}

impl ScaledAdd {
    /// `a + scale * b`.
    pub fn new(scale: f32) -> Self {
        ScaledAdd { scale, skip_branch: false }
    }
}

impl Kernel for ScaledAdd {
    fn kind(&self) -> &'static str {
        "scaled_add"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port_any("a"), port_any("b")]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port_any("y")]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        if inputs[0] != inputs[1] {
            return Err(format!(
                "a {} and b {} differ",
                crate::graph::fmt_shape(&inputs[0]),
                crate::graph::fmt_shape(&inputs[1])
            ));
        }
        Ok(vec![inputs[0].clone()])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        if inputs[0].shape() != inputs[1].shape() {
            return Err(format!("a {:?} and b {:?} differ", inputs[0].shape(), inputs[1].shape()));
        }
        let mut y = inputs[0].as_standard_layout().into_owned();
        if !self.skip_branch {
            let b = data(inputs[1], "b")?;
            let ys = y.as_slice_mut().ok_or("output not contiguous")?;
            if self.scale == 1.0 {
                for (o, &v) in ys.iter_mut().zip(b) {
                    *o += v;
                }
            } else {
                for (o, &v) in ys.iter_mut().zip(b) {
                    *o += v * self.scale;
                }
            }
        }
        Ok(vec![y])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"scale": self.scale, "skip_branch": self.skip_branch})
    }
    fn with_param_fault(&self, fault: &ParamFault) -> Option<Box<dyn Kernel>> {
        match fault {
            ParamFault::SkipBranch => Some(Box::new(ScaledAdd { skip_branch: true, ..self.clone() })),
            _ => None,
        }
    }
}

/// `y = x * factor`, any layout (Granite's `inputs_embeds * embedding_multiplier`).
///
/// Upstream: transformers v5.24.0 src/transformers/models/granite/modeling_granite.py
/// `GraniteModel.forward`.
#[derive(Debug, Clone)]
pub struct Scale {
    /// The multiplier.
    pub factor: f32,
}

impl Kernel for Scale {
    fn kind(&self) -> &'static str {
        "scale"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port_any("x")]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port_any("y")]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        Ok(vec![inputs[0].clone()])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        let f = self.factor;
        Ok(vec![inputs[0].mapv(|v| v * f)])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"factor": self.factor})
    }
}

/// Identity copy of a token-major edge: marks the end of a stack whose output the reference
/// captures as one module (the projector's Q-Former).
#[derive(Debug, Clone, Default)]
pub struct Identity;

impl Kernel for Identity {
    fn kind(&self) -> &'static str {
        "identity"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("x", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        Ok(vec![inputs[0].clone()])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        Ok(vec![inputs[0].to_owned()])
    }
}

// ------------------------------------------------------------------------------------------------
// Conformer
// ------------------------------------------------------------------------------------------------

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
    fn kind(&self) -> &'static str {
        "pointwise_conv"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("x", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn weight_roles(&self) -> Vec<&'static str> {
        if self.bias {
            vec!["weight", "bias"]
        } else {
            vec!["weight"]
        }
    }
    fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (rows, k) = token_rows(&inputs[0], "x")?;
        let w = &weights[0];
        if w.len() != 3 || w[1] != k || w[2] != 1 {
            return Err(format!("weight must be [out, {k}, 1], got {w:?}"));
        }
        if self.bias && weights[1] != [w[0]] {
            return Err(format!("bias must be [{}], got {:?}", w[0], weights[1]));
        }
        Ok(vec![vec![rows, Dim::Fixed(w[0])]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
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
            let b = data(weights[1], "bias")?;
            if b.len() != n {
                return Err(format!("bias has {} elements, expected {n}", b.len()));
            }
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
    fn kind(&self) -> &'static str {
        "glu"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("x", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (rows, c2) = token_rows(&inputs[0], "x")?;
        if c2 % 2 != 0 {
            return Err(format!("{c2} channels do not split into GLU halves"));
        }
        Ok(vec![vec![rows, Dim::Fixed(c2 / 2)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
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
    fn kind(&self) -> &'static str {
        "depthwise_conv"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("x", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn weight_roles(&self) -> Vec<&'static str> {
        vec!["weight"]
    }
    fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (_, c) = token_rows(&inputs[0], "x")?;
        if weights[0] != [c, 1, self.kernel] {
            return Err(format!("weight must be [{c}, 1, {}], got {:?}", self.kernel, weights[0]));
        }
        Ok(vec![inputs[0].clone()])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        let s = dims(inputs[0], 2, "x")?;
        let (t, c) = (s[0], s[1]);
        let k = self.kernel;
        if weights[0].shape() != [c, 1, k] {
            return Err(format!("weight {:?} does not fit {c} channels, kernel {k}", weights[0].shape()));
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

/// `nn.BatchNorm1d` in inference form over the channels of token-major rows:
/// `alpha = weight / sqrt(running_var + eps)`, `y = x * alpha + (bias - running_mean * alpha)`.
/// Fault seam: [`ParamFault::Eps`].
///
/// Upstream: transformers v5.24.0 src/transformers/models/granite_speech/modeling_granite_speech.py
/// `GraniteSpeechConformerConvModule` (`self.batch_norm`); pytorch v2.11.0
/// aten/src/ATen/native/cpu/batch_norm_kernel.cpp `batch_norm_cpu_collect_linear_and_constant_terms`.
#[derive(Debug, Clone)]
pub struct BatchNorm {
    /// Added to the running variance.
    pub eps: f32,
}

impl Kernel for BatchNorm {
    fn kind(&self) -> &'static str {
        "batch_norm"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("x", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn weight_roles(&self) -> Vec<&'static str> {
        vec!["weight", "bias", "running_mean", "running_var"]
    }
    fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (_, c) = token_rows(&inputs[0], "x")?;
        for (w, n) in weights.iter().zip(self.weight_roles()) {
            if w != &[c] {
                return Err(format!("{n} must be [{c}], got {w:?}"));
            }
        }
        Ok(vec![inputs[0].clone()])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        let s = dims(inputs[0], 2, "x")?;
        let c = s[1];
        let p: Vec<&[f32]> = weights.iter().map(|w| data(w, "batch norm parameter")).collect::<Result<_, _>>()?;
        if p.iter().any(|v| v.len() != c) {
            return Err(format!("batch norm parameters must have {c} elements"));
        }
        let alpha: Vec<f32> = (0..c).map(|j| p[0][j] / (p[3][j] + self.eps).sqrt()).collect();
        let beta: Vec<f32> = (0..c).map(|j| p[1][j] - p[2][j] * alpha[j]).collect();
        let mut y = inputs[0].as_standard_layout().into_owned();
        let ys = y.as_slice_mut().ok_or("output not contiguous")?;
        for row in ys.chunks_exact_mut(c) {
            for j in 0..c {
                row[j] = row[j] * alpha[j] + beta[j];
            }
        }
        Ok(vec![y])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"eps": self.eps})
    }
    fn with_param_fault(&self, fault: &ParamFault) -> Option<Box<dyn Kernel>> {
        match fault {
            ParamFault::Eps(e) => Some(Box::new(BatchNorm { eps: *e })),
            _ => None,
        }
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
/// (multiplies the score scale), [`ParamFault::Causal`] (mask keys after the query within a block).
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
    fn kind(&self) -> &'static str {
        "shaw_block_attention"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("q", Layout::TokenMajor), port("kv", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn weight_roles(&self) -> Vec<&'static str> {
        vec!["rel_pos_emb"]
    }
    fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let inner = self.heads * self.dim_head;
        let (rows, qf) = token_rows(&inputs[0], "q")?;
        let (kv_rows, kvf) = token_rows(&inputs[1], "kv")?;
        same_dim(&rows, &kv_rows, "rows of q and kv")?;
        if qf != inner || kvf != 2 * inner {
            return Err(format!("q must have {inner} and kv {} features, got {qf} and {kvf}", 2 * inner));
        }
        if weights[0] != [2 * self.max_pos_emb + 1, self.dim_head] {
            return Err(format!("rel_pos_emb must be [{}, {}], got {:?}", 2 * self.max_pos_emb + 1, self.dim_head, weights[0]));
        }
        if self.context == 0 || self.context > self.max_pos_emb {
            return Err(format!("context {} must be in 1..={}", self.context, self.max_pos_emb));
        }
        Ok(vec![vec![rows, Dim::Fixed(inner)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        let (h, d, c) = (self.heads, self.dim_head, self.context);
        let inner = h * d;
        let qs = dims(inputs[0], 2, "q")?;
        let kvs = dims(inputs[1], 2, "kv")?;
        let t = qs[0];
        if qs[1] != inner || kvs != [t, 2 * inner] {
            return Err(format!("q {qs:?} and kv {kvs:?} do not fit {h} heads of {d}"));
        }
        if weights[0].shape() != [2 * self.max_pos_emb + 1, d] || c == 0 || c > self.max_pos_emb {
            return Err(format!("rel_pos_emb {:?} does not fit max_pos_emb {} / context {c}", weights[0].shape(), self.max_pos_emb));
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
                        let kj = &kv[(base + j) * 2 * inner + hi * d..(base + j) * 2 * inner + (hi + 1) * d];
                        let r = i + self.max_pos_emb - j;
                        let rj = &rel[r * d..(r + 1) * d];
                        *s = simd::dot(qi, kj) * scale + simd::dot(qi, rj) * scale;
                    }
                    softmax_in_place(&mut sc[..n]);
                    let o = &mut out[i * d..(i + 1) * d];
                    for (j, &p) in sc[..n].iter().enumerate() {
                        let off = (base + j) * 2 * inner + inner + hi * d;
                        let vj = &kv[off..off + d];
                        for (ov, &vv) in o.iter_mut().zip(vj) {
                            *ov += p * vv;
                        }
                    }
                }
                res.push((b, hi, rows, out));
            }
            res
        });
        let mut y = vec![0f32; t * inner];
        for (b, hi, rows, out) in parts.into_iter().flatten() {
            for i in 0..rows {
                let r = b * c + i;
                y[r * inner + hi * d..r * inner + (hi + 1) * d].copy_from_slice(&out[i * d..(i + 1) * d]);
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
        match fault {
            ParamFault::AttnScale(f) => Some(Box::new(ShawBlockAttention { scale: self.scale * f, ..self.clone() })),
            ParamFault::Causal(on) => Some(Box::new(ShawBlockAttention { causal: *on, ..self.clone() })),
            _ => None,
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Self-conditioning and BPE-CTC
// ------------------------------------------------------------------------------------------------

/// Softmax over the channels of token-major rows (float32, as the reference's mid softmax).
///
/// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNarEncoder.forward`
/// (`torch.softmax(mid_logits, dim=-1)`).
#[derive(Debug, Clone, Default)]
pub struct Softmax;

impl Kernel for Softmax {
    fn kind(&self) -> &'static str {
        "softmax"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("x", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        token_rows(&inputs[0], "x")?;
        Ok(vec![inputs[0].clone()])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        let s = dims(inputs[0], 2, "x")?;
        let mut y = inputs[0].as_standard_layout().into_owned();
        if s[1] > 0 {
            for row in y.as_slice_mut().ok_or("output not contiguous")?.chunks_exact_mut(s[1]) {
                softmax_in_place(row);
            }
        }
        Ok(vec![y])
    }
}

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
    fn kind(&self) -> &'static str {
        "column"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("x", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::Plain)]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (rows, c) = token_rows(&inputs[0], "x")?;
        if self.index >= c {
            return Err(format!("channel {} of {c}", self.index));
        }
        Ok(vec![vec![rows]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
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
    fn kind(&self) -> &'static str {
        "posterior_weighted_pool"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("h", Layout::TokenMajor), port("blank", Layout::Plain)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (rows, hdim) = token_rows(&inputs[0], "h")?;
        rank(&inputs[1], 1, "blank")?;
        same_dim(&rows, &inputs[1][0], "frames of h and blank")?;
        if self.window == 0 {
            return Err("window must be positive".into());
        }
        Ok(vec![vec![Dim::sym(SYM_BPE_FRAMES), Dim::Fixed(hdim)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        let s = dims(inputs[0], 2, "h")?;
        let (t, hd) = (s[0], s[1]);
        let bs = dims(inputs[1], 1, "blank")?;
        if bs[0] != t || self.window == 0 {
            return Err(format!("blank has {} frames, h has {t} (window {})", bs[0], self.window));
        }
        let h = data(inputs[0], "h")?;
        let blank = data(inputs[1], "blank")?;
        let w = self.window;
        let n = t.div_ceil(w);
        let mut y = vec![0f32; n * hd];
        for b in 0..n {
            let frames = b * w..((b + 1) * w).min(t);
            let imp: Vec<f32> = frames.clone().map(|f| 1.0 - blank[f]).collect();
            let denom = imp.iter().fold(0f32, |a, &v| a + v) + super::POOL_EPS;
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
        serde_json::json!({"window": self.window, "eps": super::POOL_EPS})
    }
}

// ------------------------------------------------------------------------------------------------
// Channel concat / slice
// ------------------------------------------------------------------------------------------------

const PORT_NAMES: [&str; 16] = ["x0", "x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8", "x9", "x10", "x11", "x12", "x13", "x14", "x15"];

/// Most inputs a [`ConcatChannels`] takes.
pub const MAX_CONCAT: usize = PORT_NAMES.len();

/// Concatenate token-major rows along channels: `[T, d_0], ..., [T, d_{n-1}] -> [T, sum d_i]`.
///
/// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNARForConditionalGeneration.capture_features`
/// (`torch.cat(..., dim=-1)`), `GraniteNarProjector.forward` (per-slice LayerNorm concat).
#[derive(Debug, Clone)]
pub struct ConcatChannels {
    /// Number of inputs (at most [`MAX_CONCAT`]).
    pub n: usize,
}

impl Kernel for ConcatChannels {
    fn kind(&self) -> &'static str {
        "concat_channels"
    }
    fn inputs(&self) -> Vec<Port> {
        PORT_NAMES.iter().take(self.n).map(|&p| port(p, Layout::TokenMajor)).collect()
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        if self.n == 0 || self.n > MAX_CONCAT {
            return Err(format!("{} inputs; 1..={MAX_CONCAT} supported", self.n));
        }
        let (rows, _) = token_rows(&inputs[0], "x0")?;
        let mut total = 0;
        for (i, s) in inputs.iter().enumerate() {
            let (r, c) = token_rows(s, PORT_NAMES[i])?;
            same_dim(&rows, &r, "rows of the concatenated inputs")?;
            total += c;
        }
        Ok(vec![vec![rows, Dim::Fixed(total)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| dims(t, 2, "x")).collect::<Result<_, _>>()?;
        let t = shapes.first().map(|s| s[0]).unwrap_or(0);
        if shapes.iter().any(|s| s[0] != t) {
            return Err(format!("row counts differ: {shapes:?}"));
        }
        let total: usize = shapes.iter().map(|s| s[1]).sum();
        let mut y = vec![0f32; t * total];
        let mut off = 0;
        for (x, s) in inputs.iter().zip(&shapes) {
            let xd = data(x, "x")?;
            let c = s[1];
            for r in 0..t {
                y[r * total + off..r * total + off + c].copy_from_slice(&xd[r * c..(r + 1) * c]);
            }
            off += c;
        }
        Ok(vec![tensor(&[t, total], y)?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"inputs": self.n})
    }
}

/// Channels `start .. start + len` of token-major rows.
///
/// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNarProjector.forward` (`x[:, :, i]` of the
/// `[B, T, L, E]` view).
#[derive(Debug, Clone)]
pub struct ChannelSlice {
    /// First channel.
    pub start: usize,
    /// Channels.
    pub len: usize,
}

impl Kernel for ChannelSlice {
    fn kind(&self) -> &'static str {
        "channel_slice"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("x", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (rows, c) = token_rows(&inputs[0], "x")?;
        if self.start + self.len > c {
            return Err(format!("channels {}..{} of {c}", self.start, self.start + self.len));
        }
        Ok(vec![vec![rows, Dim::Fixed(self.len)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        let s = dims(inputs[0], 2, "x")?;
        if self.start + self.len > s[1] {
            return Err(format!("channels {}..{} of {}", self.start, self.start + self.len, s[1]));
        }
        let x = data(inputs[0], "x")?;
        let y: Vec<f32> = x.chunks_exact(s[1]).flat_map(|r| r[self.start..self.start + self.len].iter().copied()).collect();
        Ok(vec![tensor(&[s[0], self.len], y)?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"start": self.start, "len": self.len})
    }
}

// ------------------------------------------------------------------------------------------------
// Projector windows
// ------------------------------------------------------------------------------------------------

/// Zero right-pad token-major rows to whole windows: `[T, H] -> [ceil(T / block) * block, H]`.
///
/// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNarProjector.forward` (`F.pad`, `view`).
#[derive(Debug, Clone)]
pub struct WindowPad {
    /// Window rows.
    pub block: usize,
}

impl Kernel for WindowPad {
    fn kind(&self) -> &'static str {
        "window_pad"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("x", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (_, c) = token_rows(&inputs[0], "x")?;
        if self.block == 0 {
            return Err("block must be positive".into());
        }
        Ok(vec![vec![Dim::sym(SYM_PROJ_ROWS), Dim::Fixed(c)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
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
    fn kind(&self) -> &'static str {
        "add_window_positions"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("x", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn weight_roles(&self) -> Vec<&'static str> {
        vec!["window_positions"]
    }
    fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (_, c) = token_rows(&inputs[0], "x")?;
        let w = &weights[0];
        if w.len() != 3 || w[0] != 1 || w[2] != c || w[1] == 0 {
            return Err(format!("window_positions must be [1, block, {c}], got {w:?}"));
        }
        Ok(vec![inputs[0].clone()])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        let s = dims(inputs[0], 2, "x")?;
        let ws = dims(weights[0], 3, "window_positions")?;
        let (block, c) = (ws[1], ws[2]);
        if c != s[1] || block == 0 || s[0] % block != 0 {
            return Err(format!("x {s:?} is not whole windows of window_positions {ws:?}"));
        }
        let wp = data(weights[0], "window_positions")?;
        let mut y = inputs[0].as_standard_layout().into_owned();
        for (i, v) in y.as_slice_mut().ok_or("output not contiguous")?.iter_mut().enumerate() {
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
    fn kind(&self) -> &'static str {
        "query_init"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("x", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn weight_roles(&self) -> Vec<&'static str> {
        vec!["query"]
    }
    fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (_, c) = token_rows(&inputs[0], "x")?;
        let w = &weights[0];
        if w.len() != 3 || w[0] != 1 || w[2] != c || w[1] == 0 || self.downsample == 0 {
            return Err(format!("query must be [1, n_query, {c}], got {w:?} (downsample {})", self.downsample));
        }
        Ok(vec![vec![Dim::sym(SYM_PROJ_TOKENS), Dim::Fixed(c)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        let s = dims(inputs[0], 2, "x")?;
        let ws = dims(weights[0], 3, "query")?;
        let (nq, c, ds) = (ws[1], ws[2], self.downsample);
        let block = nq * ds;
        if c != s[1] || block == 0 || s[0] % block != 0 {
            return Err(format!("x {s:?} is not whole windows of {nq} queries x {ds} rows"));
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
/// concatenated (before `o_proj`). Fault seam: [`ParamFault::AttnScale`].
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
    fn kind(&self) -> &'static str {
        "window_cross_attention"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("q", Layout::TokenMajor), port("k", Layout::TokenMajor), port("v", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (qr, qc) = token_rows(&inputs[0], "q")?;
        let (kr, kc) = token_rows(&inputs[1], "k")?;
        let (vr, vc) = token_rows(&inputs[2], "v")?;
        same_dim(&kr, &vr, "rows of k and v")?;
        if qc != kc || qc != vc || self.heads == 0 || qc % self.heads != 0 {
            return Err(format!("q/k/v widths {qc}/{kc}/{vc} must agree and split into {} heads", self.heads));
        }
        Ok(vec![vec![qr, Dim::Fixed(qc)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        let qs = dims(inputs[0], 2, "q")?;
        let ks = dims(inputs[1], 2, "k")?;
        let vs = dims(inputs[2], 2, "v")?;
        let (nq, blk, hn) = (self.n_query, self.block, self.heads);
        let c = qs[1];
        if nq == 0 || blk == 0 || hn == 0 || c % hn != 0 || ks != vs || ks[1] != c || qs[0] % nq != 0 || ks[0] != qs[0] / nq * blk {
            return Err(format!("q {qs:?}, k {ks:?}, v {vs:?} are not whole windows of {nq} queries / {blk} keys"));
        }
        let nb = qs[0] / nq;
        let d = c / hn;
        let (q, k, v) = (data(inputs[0], "q")?, data(inputs[1], "k")?, data(inputs[2], "v")?);
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
                    for (j, &p) in sc.iter().enumerate() {
                        let kr = w * blk + j;
                        for (ov, &vv) in o.iter_mut().zip(&v[kr * c + hi * d..kr * c + (hi + 1) * d]) {
                            *ov += p * vv;
                        }
                    }
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
            ParamFault::AttnScale(f) => Some(Box::new(WindowCrossAttention { scale: self.scale * f, ..self.clone() })),
            _ => None,
        }
    }
}

// ------------------------------------------------------------------------------------------------
// LM input / output rows
// ------------------------------------------------------------------------------------------------

/// The audio rows the LM sees: the first `floor(enc_frames / downsample)` projector tokens,
/// divided by `divisor` (`embedding_multiplier` when `scale_projected_embeddings`). Inputs: the
/// projector output `[proj_tokens, D]` and any `[enc_frames, *]` edge (its row count is
/// `enc_frames`). Output `[n_audio, D]`.
///
/// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNARForConditionalGeneration.forward`
/// (`audio_embeds / embedding_multiplier`, `n_audio = T // downsample_rate`) and `decode_text`
/// (`audio_embeds[:, :n_audio]`).
#[derive(Debug, Clone)]
pub struct AudioPrefix {
    /// Encoder frames per audio row.
    pub downsample: usize,
    /// Divides every element (None: no scaling).
    pub divisor: Option<f32>,
}

impl Kernel for AudioPrefix {
    fn kind(&self) -> &'static str {
        "audio_prefix"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("x", Layout::TokenMajor), port("frames", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (_, c) = token_rows(&inputs[0], "x")?;
        rank(&inputs[1], 2, "frames")?;
        if self.downsample == 0 {
            return Err("downsample must be positive".into());
        }
        Ok(vec![vec![Dim::sym(SYM_N_AUDIO), Dim::Fixed(c)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        let s = dims(inputs[0], 2, "x")?;
        let frames = dims(inputs[1], 2, "frames")?[0];
        if self.downsample == 0 {
            return Err("downsample must be positive".into());
        }
        let n = frames / self.downsample;
        if n > s[0] {
            return Err(format!("{frames} frames give {n} audio rows, only {} projector tokens", s[0]));
        }
        let x = data(inputs[0], "x")?;
        let y: Vec<f32> = match self.divisor {
            Some(dv) => x[..n * s[1]].iter().map(|&v| v / dv).collect(),
            None => x[..n * s[1]].to_vec(),
        };
        Ok(vec![tensor(&[n, s[1]], y)?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"downsample": self.downsample, "divisor": self.divisor})
    }
}

/// Concatenate token-major rows: `[A, D] + [B, D] -> [n_total, D]`.
///
/// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNARForConditionalGeneration.decode_text`
/// (`torch.cat([audio_embeds[:, :n_audio], text_emb], dim=1)`).
#[derive(Debug, Clone, Default)]
pub struct ConcatRows;

impl Kernel for ConcatRows {
    fn kind(&self) -> &'static str {
        "concat_rows"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("a", Layout::TokenMajor), port("b", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (_, a) = token_rows(&inputs[0], "a")?;
        let (_, b) = token_rows(&inputs[1], "b")?;
        if a != b {
            return Err(format!("widths {a} and {b} differ"));
        }
        Ok(vec![vec![Dim::sym(SYM_N_TOTAL), Dim::Fixed(a)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        let a = dims(inputs[0], 2, "a")?;
        let b = dims(inputs[1], 2, "b")?;
        if a[1] != b[1] {
            return Err(format!("widths {} and {} differ", a[1], b[1]));
        }
        let mut y = data(inputs[0], "a")?.to_vec();
        y.extend_from_slice(data(inputs[1], "b")?);
        Ok(vec![tensor(&[a[0] + b[0], a[1]], y)?])
    }
}

/// The last `len(ids)` rows of token-major `x` (the text rows after the audio prefix): x
/// `[n_total, D]`, ids `[n_text]` -> `[n_text, D]`.
///
/// Upstream: oracle/xray_oracle/granite_nar.py `GraniteNARForConditionalGeneration.decode_text`
/// (`hidden[:, n_audio:]`).
#[derive(Debug, Clone, Default)]
pub struct TailRows;

impl Kernel for TailRows {
    fn kind(&self) -> &'static str {
        "tail_rows"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("x", Layout::TokenMajor), port("ids", Layout::Plain)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (_, c) = token_rows(&inputs[0], "x")?;
        rank(&inputs[1], 1, "ids")?;
        Ok(vec![vec![inputs[1][0].clone(), Dim::Fixed(c)]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        let s = dims(inputs[0], 2, "x")?;
        let n = dims(inputs[1], 1, "ids")?[0];
        if n > s[0] {
            return Err(format!("{n} text rows of {} rows", s[0]));
        }
        let x = data(inputs[0], "x")?;
        tensor(&[n, s[1]], x[(s[0] - n) * s[1]..].to_vec()).map(|t| vec![t])
    }
}

// ------------------------------------------------------------------------------------------------
// Granite LM
// ------------------------------------------------------------------------------------------------

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
    fn kind(&self) -> &'static str {
        "rms_norm"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("x", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn weight_roles(&self) -> Vec<&'static str> {
        vec!["weight"]
    }
    fn infer(&self, inputs: &[Shape], weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        let (_, c) = token_rows(&inputs[0], "x")?;
        if weights[0] != [c] {
            return Err(format!("weight must be [{c}], got {:?}", weights[0]));
        }
        Ok(vec![inputs[0].clone()])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        let s = dims(inputs[0], 2, "x")?;
        let c = s[1];
        let w = data(weights[0], "weight")?;
        if w.len() != c {
            return Err(format!("weight has {} elements, x has {c} features", w.len()));
        }
        let mut y = inputs[0].as_standard_layout().into_owned();
        if c > 0 {
            for row in y.as_slice_mut().ok_or("output not contiguous")?.chunks_exact_mut(c) {
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

/// Default (non-interleaved, "rotate_half") RoPE on head-major `[H, T, D]`, positions
/// `offset .. offset + T`: `inv_freq_i = 1 / theta^(2i / D)` (f32, as torch computes it),
/// angle = `pos * inv_freq` over `cat(inv_freq, inv_freq)`, `x' = x cos + cat(-x2, x1) sin`.
/// Fault seam: [`ParamFault::RopeOffset`].
///
/// Upstream: transformers v5.24.0 src/transformers/models/granite/modeling_granite.py
/// `GraniteRotaryEmbedding.compute_default_rope_parameters`, `GraniteRotaryEmbedding.forward`,
/// `rotate_half`, `apply_rotary_pos_emb`.
#[derive(Debug, Clone)]
pub struct Rope {
    /// Base.
    pub theta: f32,
    /// Position of the first row (0; shifted only by a fault).
    pub offset: i64,
}

impl Kernel for Rope {
    fn kind(&self) -> &'static str {
        "rope"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("x", Layout::HeadMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::HeadMajor)]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        rank(&inputs[0], 3, "x")?;
        let d = fixed(&inputs[0][2], "head_dim")?;
        if d % 2 != 0 {
            return Err(format!("head_dim {d} is odd"));
        }
        Ok(vec![inputs[0].clone()])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        let s = dims(inputs[0], 3, "x")?;
        let (h, t, d) = (s[0], s[1], s[2]);
        if d % 2 != 0 {
            return Err(format!("head_dim {d} is odd"));
        }
        let half = d / 2;
        let inv: Vec<f32> = (0..half).map(|i| 1.0 / self.theta.powf((2 * i) as f32 / d as f32)).collect();
        let mut cos = vec![0f32; t * half];
        let mut sin = vec![0f32; t * half];
        for ti in 0..t {
            let pos = (ti as i64 + self.offset) as f32;
            for i in 0..half {
                let a = pos * inv[i];
                cos[ti * half + i] = a.cos();
                sin[ti * half + i] = a.sin();
            }
        }
        let x = data(inputs[0], "x")?;
        let mut y = vec![0f32; h * t * d];
        for hi in 0..h {
            for ti in 0..t {
                let r = (hi * t + ti) * d;
                let (xr, yr) = (&x[r..r + d], &mut y[r..r + d]);
                for i in 0..half {
                    let (c, sn) = (cos[ti * half + i], sin[ti * half + i]);
                    yr[i] = xr[i] * c + (-xr[half + i]) * sn;
                    yr[half + i] = xr[half + i] * c + xr[i] * sn;
                }
            }
        }
        Ok(vec![tensor(&[h, t, d], y)?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"theta": self.theta, "offset": self.offset, "style": "rotate_half"})
    }
    fn with_param_fault(&self, fault: &ParamFault) -> Option<Box<dyn Kernel>> {
        match fault {
            ParamFault::RopeOffset(o) => Some(Box::new(Rope { offset: self.offset + o, ..self.clone() })),
            _ => None,
        }
    }
}

/// Grouped-query attention, head-major: q `[Hq, T, D]`, k `[Hkv, S, D]`, v `[Hkv, S, Dv]`; query
/// head h uses kv head `h / (Hq / Hkv)`; scores `(q . k) * scale` (Granite's
/// `attention_multiplier`), softmax, `sum p v`. No mask (the NAR LM is bidirectional). Fault
/// seams: [`ParamFault::AttnScale`], [`ParamFault::Causal`] (query t sees keys `..= S - T + t`).
///
/// Upstream: transformers v5.24.0 src/transformers/models/granite/modeling_granite.py
/// `eager_attention_forward`, `repeat_kv`, `GraniteAttention.forward`; the all-attend 4D mask of
/// oracle/xray_oracle/granite_nar.py `GraniteNARForConditionalGeneration.decode_text`.
#[derive(Debug, Clone)]
pub struct GqaAttention {
    /// Score scale.
    pub scale: f32,
    /// Causal mask (off for the NAR LM; a fault turns it on).
    pub causal: bool,
}

impl Kernel for GqaAttention {
    fn kind(&self) -> &'static str {
        "gqa_attention"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("q", Layout::HeadMajor), port("k", Layout::HeadMajor), port("v", Layout::HeadMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::HeadMajor)]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        for (s, n) in inputs.iter().zip(["q", "k", "v"]) {
            rank(s, 3, n)?;
        }
        let hq = fixed(&inputs[0][0], "query heads")?;
        let hk = fixed(&inputs[1][0], "key heads")?;
        same_dim(&inputs[1][0], &inputs[2][0], "heads of k and v")?;
        same_dim(&inputs[0][2], &inputs[1][2], "head_dim of q and k")?;
        same_dim(&inputs[1][1], &inputs[2][1], "keys of k and v")?;
        if hk == 0 || hq % hk != 0 {
            return Err(format!("{hq} query heads are not a multiple of {hk} kv heads"));
        }
        Ok(vec![vec![inputs[0][0].clone(), inputs[0][1].clone(), inputs[2][2].clone()]])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        let qs = dims(inputs[0], 3, "q")?;
        let ks = dims(inputs[1], 3, "k")?;
        let vs = dims(inputs[2], 3, "v")?;
        let (hq, t, d) = (qs[0], qs[1], qs[2]);
        let (hk, s, dv) = (ks[0], ks[1], vs[2]);
        if hk == 0 || hq % hk != 0 || ks[2] != d || vs[0] != hk || vs[1] != s {
            return Err(format!("q {qs:?}, k {ks:?}, v {vs:?} do not fit together"));
        }
        if self.causal && s < t {
            return Err(format!("causal attention with {t} queries needs at least {t} keys, got {s}"));
        }
        let group = hq / hk;
        let past = s - t.min(s);
        let (q, k, v) = (data(inputs[0], "q")?, data(inputs[1], "k")?, data(inputs[2], "v")?);
        let parts = par_ranges(hq, t * s * (d + dv), |heads| {
            let mut part = vec![0f32; heads.len() * t * dv];
            let mut sc = vec![0f32; s];
            for (j, hi) in heads.enumerate() {
                let kh = hi / group;
                for ti in 0..t {
                    let qi = &q[(hi * t + ti) * d..(hi * t + ti + 1) * d];
                    let n = if self.causal { past + ti + 1 } else { s };
                    for (kj, sv) in sc[..n].iter_mut().enumerate() {
                        *sv = simd::dot(qi, &k[(kh * s + kj) * d..(kh * s + kj + 1) * d]) * self.scale;
                    }
                    softmax_in_place(&mut sc[..n]);
                    let o = &mut part[(j * t + ti) * dv..(j * t + ti + 1) * dv];
                    for (kj, &p) in sc[..n].iter().enumerate() {
                        for (ov, &vv) in o.iter_mut().zip(&v[(kh * s + kj) * dv..(kh * s + kj + 1) * dv]) {
                            *ov += p * vv;
                        }
                    }
                }
            }
            part
        });
        Ok(vec![tensor(&[hq, t, dv], parts.concat())?])
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({"scale": self.scale, "causal": self.causal})
    }
    fn with_param_fault(&self, fault: &ParamFault) -> Option<Box<dyn Kernel>> {
        match fault {
            ParamFault::AttnScale(f) => Some(Box::new(GqaAttention { scale: self.scale * f, ..self.clone() })),
            ParamFault::Causal(on) => Some(Box::new(GqaAttention { causal: *on, ..self.clone() })),
            _ => None,
        }
    }
}

/// SwiGLU: `silu(gate) * up`, token-major.
///
/// Upstream: transformers v5.24.0 src/transformers/models/granite/modeling_granite.py
/// `GraniteMLP.forward` (`down_proj(act_fn(gate_proj(x)) * up_proj(x))`).
#[derive(Debug, Clone, Default)]
pub struct SwiGlu;

impl Kernel for SwiGlu {
    fn kind(&self) -> &'static str {
        "swiglu"
    }
    fn inputs(&self) -> Vec<Port> {
        vec![port("gate", Layout::TokenMajor), port("up", Layout::TokenMajor)]
    }
    fn outputs(&self) -> Vec<Port> {
        vec![port("y", Layout::TokenMajor)]
    }
    fn infer(&self, inputs: &[Shape], _weights: &[Vec<usize>]) -> Result<Vec<Shape>, String> {
        token_rows(&inputs[0], "gate")?;
        if inputs[0] != inputs[1] {
            return Err("gate and up shapes differ".into());
        }
        Ok(vec![inputs[0].clone()])
    }
    fn run(&self, _ctx: &KernelCtx, inputs: &[&Tensor], _weights: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        if inputs[0].shape() != inputs[1].shape() {
            return Err(format!("gate {:?} and up {:?} differ", inputs[0].shape(), inputs[1].shape()));
        }
        let up = data(inputs[1], "up")?;
        let mut y = inputs[0].as_standard_layout().into_owned();
        for (g, &u) in y.as_slice_mut().ok_or("output not contiguous")?.iter_mut().zip(up) {
            *g = silu(*g) * u;
        }
        Ok(vec![y])
    }
}
